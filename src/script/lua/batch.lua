-- batch: run one single-key lock script for many keys of one node in one call (the client's
-- per-node auto-batching). The client builds it from a script (its `#!lua` flags plus
-- `allow-cross-slot-keys`): `memo`, then what the script's prologue and snippets run once per
-- call (the code above their `--@key` line) in place of `--@call`, then the rest of them and
-- the script's body as the function `op(KEYS, ARGV)` below, so every key runs exactly the code
-- of the single script. The once-per-call code reads neither KEYS nor ARGV.
--
-- KEYS[1] the first entry's key (it routes the call to the node serving its slot).
-- ARGV entries, one after another: key, number of arguments n, then the n arguments the single
-- script takes for that key (its own expiry grace last). Keys of any slots this node serves
-- (undeclared keys reached through ARGV, which Redis 7 permits for local slots).
--
-- Replies: one reply per entry, in order: exactly what the single script answers for that key,
-- or an error reply for that entry alone (each entry runs under `pcall`). A key of a slot this
-- node does not serve fails at its first read, before any write ("Script attempted to access a
-- non local key"); the client then sends that entry alone, following MOVED/ASK. `memo` is one
-- table per call: `fence.lua` keeps the node's config epoch there, read once per batch.
local batch = ARGV
--@call
local function op(KEYS, ARGV)
--@body
end
local replies = {}
local i = 1
while i <= #batch do
  local n = tonumber(batch[i + 1])
  -- The fence rule's clock shift is one entry's (the epoch read stays the call's).
  memo.shift = nil
  local ok, reply = pcall(op, {batch[i]}, {unpack(batch, i + 2, i + 1 + n)})
  if not ok and type(reply) ~= 'table' then reply = redis.error_reply(tostring(reply)) end
  replies[#replies + 1] = reply
  i = i + 2 + n
end
return replies
