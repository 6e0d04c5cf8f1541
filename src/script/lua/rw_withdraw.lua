-- rw_withdraw: remove a waiting writer's intent when its call ends without a grant (timed out,
-- dropped), and announce it when `waiters` is set (removing it), so readers queued behind the
-- intent enter at once (lock prologue, fence rule, rw prologue first).
--
-- KEYS[1] the lock's hash. ARGV[1] the call's intent id, ARGV[2] announce (`s`/`p`/empty),
-- ARGV[3] expiry grace.
--
-- Replies: 1 withdrawn; 0 the intent was not this call's (nothing written). allow-oom.
#!lua flags=allow-oom
if intent ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'i', 'iu', 'waiters')
extra.i, extra.iu, extra.waiters = nil, nil, nil
settle()
if lock[5] then announce(ARGV[2]) end
return 1
