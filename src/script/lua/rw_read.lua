-- rw_read: grant a read hold of a read-write lock (lock prologue, fence rule, rw prologue first).
--
-- KEYS[1] the lock's hash (`fencelock:{NAME}:rw`). ARGV[1] owner token, ARGV[2] TTL in ms,
-- ARGV[3] floor (decimal, 0 for none), ARGV[4] `clock` | `epoch` | `counter`, ARGV[5] expiry grace.
--
-- Replies: {1, fence, behind} granted: `r:<owner>` = `<now + TTL>:<fence>`, the fence a new
-- value of the counter; {2, fence, 0} this owner already reads (a resent script: its fence, no
-- write); {0, ms, 0} refused: a live writer, or a live writer intent (a writer waits: new
-- readers queue behind it), with the ms until that lease ends; an error reply (no write) as the
-- fence rule says. Not allow-oom.
#!lua
local mine = redis.call('HGET', KEYS[1], 'r:' .. ARGV[1])
if mine and (until_of(mine) or 0) > now_ms then return {2, fence_of(mine) or 0, 0} end
if writer_live then return {0, writer_until - now_ms, 0} end
if intent_live then return {0, intent_until - now_ms, 0} end
local fence, behind = next_fence(tonumber(lock[3]) or 0, ARGV[3], ARGV[4])
if not fence then return behind end
local ends = now_ms + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'r:' .. ARGV[1],
  string.format('%.0f', ends) .. ':' .. string.format('%.0f', fence),
  'fence', string.format('%.0f', fence))
raise(fence, ends)
return {1, fence, behind}
