-- force_unlock: an operator frees a mutex whoever holds it (lock prologue, keep.lua and the
-- inspection snippet first; a call that meets a queue runs the fence rule, raise.lua and the queue snippet
-- fair.lua, inlined at its `--@queue` line). Every hold goes (`clear(KEYS[1], lock)`: owner, lease, hold count and hold
-- fields), the fence stays, so the next grant is above the freed one; the key's expiry follows
-- the rule of every write (`keep`), and a freed live lock is announced on the lock's channel; with
-- a queue (`waiters` is `q`, acquire.lua) the lock goes to the head place instead, as release.lua
-- hands it.
-- A freed live hold leaves its owner token in the field `forced` (one field, replaced by the
-- next forced unlock, gone with the key), so that owner's next call can tell a forced unlock
-- from an expiry.
--
-- KEYS[1] the lock key. ARGV[1] announce: `s` SPUBLISH, `p` PUBLISH, empty for none; ARGV[2]
-- open TTL ms (unused), ARGV[3] expiry grace. Every kind's force-unlock script takes the same
-- ARGV.
--
-- Replies: the inspection (`inspect.lua`) of the state it found, before freeing it. The old
-- holder's next `release`, `extend`, `renew` or `reenter` then answers -2 (freed by a forced
-- unlock); a release that hands the lock on within the holder's client makes no call, so the
-- task it hands to learns it at its own next call. Those scripts read `forced` (one HGET) on
-- their failure paths only. allow-oom: it only frees.
#!lua flags=allow-oom
local before = inspect('lock')
if owner then
  clear(KEYS[1], lock)
  if live then redis.call('HSET', KEYS[1], 'forced', owner) end
  local handed_on = false
  if lock[5] == 'q' then
--@queue
    handed_on = hand_head(ARGV[1], lock[3])
  end
  if not handed_on then
    keep(KEYS[1], lock[3], now_ms)
    if live then
      if ARGV[1] == 's' then redis.call('SPUBLISH', KEYS[1], '')
      elseif ARGV[1] == 'p' then redis.call('PUBLISH', KEYS[1], '') end
    end
  end
end
return before
