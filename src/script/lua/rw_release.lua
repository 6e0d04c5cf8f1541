-- rw_release: end one hold (read or write) of this owner; the last hold of the owner removes
-- its entry and, when `waiters` is set (a refused acquire set it), removes that too and
-- announces the release on the lock's channel (lock prologue, fence rule, rw prologue first).
--
-- KEYS[1] the lock's hash. ARGV[1] owner token, ARGV[2] hold id (empty for the hold the
-- acquire granted), ARGV[3] announce: `s` SPUBLISH, `p` PUBLISH, empty for none (the channel
-- is the key); ARGV[4] expiry grace.
--
-- Replies: 1 released (or one hold of several; again 1 for a hold released twice); 0 no live
-- entry of this owner (its leftovers are removed); -1 the owner's entry is gone and another
-- owner writes; -2 (before -1/0) the owner's entry is gone and `forced` names it: a forced
-- unlock freed it (see rw_force_unlock.lua). Touches only this owner's fields. allow-oom.
#!lua flags=allow-oom
local role, ends = role()
if not role then
  if was_forced(ARGV[1]) then return -2 end
  if writer_live then return -1 end
  return 0
end
if ends <= now_ms then
  forget(ARGV[1], role)
  settle()
  return 0
end
if holds or ARGV[2] ~= '' then
  if redis.call('HDEL', KEYS[1], 'h:' .. ARGV[1] .. ':' .. ARGV[2]) == 0 then return 1 end
  if (holds or 1) > 1 then
    redis.call('HSET', KEYS[1], 'c:' .. ARGV[1], holds - 1)
    return 1
  end
end
forget(ARGV[1], role, lock[5] and 'waiters')
settle()
if lock[5] then announce(ARGV[3]) end
return 1
