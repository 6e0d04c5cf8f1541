-- reenter: add a hold to a lock this owner holds, returning the same fence (lock prologue and
-- keep.lua first).
--
-- KEYS[1] lock key. ARGV[1] owner token, ARGV[2] a fresh hold id (hex), ARGV[3] TTL in ms: the
-- lease is moved to now + TTL unless it already ends later; ARGV[4] expiry grace.
-- Holds: the state's hold count (` h<holds>`, prologue.lua) and one field `h:<id>` per hold (`h:` for the first), so a
-- resent script adds no second hold and a released hold is not released twice.
--
-- Replies: {1, fence, remaining lease ms} entered; {0, 0, 0} no live lease; {-1, 0, 0} held by
-- another owner; {-2, 0, 0} this owner's hold was freed by a forced unlock (`forced`, see
-- force_unlock.lua; before -1/0). Not allow-oom (it adds fields).
#!lua
if not live or owner ~= ARGV[1] then
  if redis.call('HGET', KEYS[1], 'forced') == ARGV[1] then return {-2, 0, 0} end
  if not live then return {0, 0, 0} end
  return {-1, 0, 0}
end
local changed = false
if not lock[4] then
  redis.call('HSET', KEYS[1], 'h:', 1, 'h:' .. ARGV[2], 1)
  lock[4], changed = 2, true
elseif redis.call('HSETNX', KEYS[1], 'h:' .. ARGV[2], 1) == 1 then
  lock[4], changed = lock[4] + 1, true
end
local ends = now_ms + ARGV[3]
if ends > expires then
  lock[2], changed = ends, true
else
  ends = expires
end
if changed then store(KEYS[1], lock) end
keep(KEYS[1], lock[3], ends)
return {1, tonumber(lock[3]), ends - now_ms}
