-- rw_withdraw: remove a waiting writer's intent when its call ends without a grant (timed out,
-- dropped), and announce it when `waiters` is set (removing it), so readers queued behind the
-- intent enter at once (own_prologue.lua, own_keep.lua, rw_prologue.lua, rw_entry.lua and
-- rw_notice.lua first).
--
-- KEYS[1] the lock's hash. ARGV[1] the call's intent id, ARGV[2] announce (`s`/`p`/empty),
-- ARGV[3] expiry grace.
--
-- Replies: 1 withdrawn; 0 the intent was not this call's (nothing written). allow-oom.
#!lua flags=allow-oom
if intent ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'i', 'iu', 'waiters')
rw[3], rw[4], rw[10] = false, false, false
settle()
if waiters then announce(ARGV[2]) end
return 1
