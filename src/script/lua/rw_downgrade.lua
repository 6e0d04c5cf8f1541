-- rw_downgrade: turn this owner's write hold into a read hold with the same fence and lease, and
-- announce it when `waiters` is set (waiting readers may enter; `waiters` is removed)
-- (own_prologue.lua, own_keep.lua, rw_prologue.lua, rw_entry.lua and rw_notice.lua first).
--
-- KEYS[1] the lock's hash. ARGV[1] owner token, ARGV[2] announce (`s`/`p`/empty), ARGV[3]
-- expiry grace.
--
-- Replies: {1, remaining ms} downgraded (also for a resent script: the owner already reads);
-- {0, 0} no live entry of this owner; {-1, 0} another owner writes; {-2, 0} refused: the
-- owner has re-entered holds besides this one (release them first); {-3, 0} (before -1/0) the owner's entry is
-- gone and `forced` names it: a forced unlock freed it (see rw_force_unlock.lua; -3, as -2 is
-- taken). allow-oom: it only rewrites this owner's fields.
#!lua flags=allow-oom
local role, expires = role()
if not role then
  if was_forced(ARGV[1]) then return {-3, 0} end
  if writer_live then return {-1, 0} end
  return {0, 0}
end
if expires <= now_ms then return {0, 0} end
if role == 'r' then return {1, expires - now_ms} end
-- One hold left of a re-entered lock (the others released) is the write hold itself: its
-- `c:`/`h:` fields stay with the read hold, and its last release removes them.
if holds and holds > 1 then return {-2, 0} end
redis.call('HDEL', KEYS[1], 'w', 'wu', 'waiters')
redis.call('HSET', KEYS[1], reader_field, string.format('%d:%d', expires, tonumber(last_fence)))
if waiters then announce(ARGV[2]) end
return {1, expires - now_ms}
