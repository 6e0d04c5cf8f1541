-- fair_extend: move this owner's lease end on the fair lock to now + TTL, as extend.lua for the
-- mutex but with no re-entry (lock prologue, fence snippet and fair snippet first).
--
-- KEYS[1] fair lock key. ARGV[1] owner token, ARGV[2] new TTL in ms, ARGV[3] expiry grace.
--
-- The key's expiry is only raised, never lowered: it may cover a waiting place's lease.
--
-- Replies: {1, remaining lease ms} extended; {0, 0} no live lease (expired); {-1, 0} held by
-- another owner (left alone); {-2, 0} freed by a forced unlock (`forced`, see
-- fair_force_unlock.lua). allow-oom.
#!lua flags=allow-oom
if not live or owner ~= ARGV[1] then
  if redis.call('HGET', KEYS[1], 'forced') == ARGV[1] then return {-2, 0} end
  if not live then return {0, 0} end
  return {-1, 0}
end
local ends = now_ms + tonumber(ARGV[2])
lock[2] = ends
store(KEYS[1], lock)
raise(lock[3], ends)
return {1, ends - now_ms}
