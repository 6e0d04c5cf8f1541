-- rw_release: end one hold (read or write) of this owner; the last hold of the owner removes
-- its entry and, when `waiters` is set (a refused acquire set it), removes that too and
-- announces the release on the lock's channel (own_prologue.lua, own_keep.lua,
-- rw_prologue.lua, rw_entry.lua and rw_forget.lua first).
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
  if rw[7] and string.find(' ' .. rw[7] .. ' ', ' ' .. ARGV[1] .. ' ', 1, true) then return -2 end
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
    redis.call('HSET', KEYS[1], 'c:' .. ARGV[1], string.format('%d', holds - 1))
    return 1
  end
end
forget(ARGV[1], role, waiters)
settle()
if waiters then
  if ARGV[3] == 's' then redis.call('SPUBLISH', KEYS[1], '')
  elseif ARGV[3] == 'p' then redis.call('PUBLISH', KEYS[1], '') end
end
return 1
