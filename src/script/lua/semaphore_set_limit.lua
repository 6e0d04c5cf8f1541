-- semaphore_set_limit: store a new limit (own_prologue.lua, fence rule,
-- own_keep.lua, semaphore.lua and semaphore_scan.lua first).
-- Permits held above a lowered limit stay until released or expired, and count against it. A
-- reservation for more permits than the new limit can never be met: it is removed (its waiter
-- finds the limit lowered at its next attempt and ends with an error).
--
-- KEYS[1] the semaphore key. ARGV[1] the new limit, ARGV[2] announce (`s`, `p` or empty, as for
-- release: a raised limit may let waiters in), ARGV[3] expiry grace.
--
-- Replies: the limit stored before (0 when none was). Not allow-oom.
#!lua
local key = KEYS[1]
local s = sem_read(key)
local limit = tonumber(ARGV[1])
redis.call('HSET', key, 'limit', ARGV[1])
if s.res and s.res.count > limit then
  redis.call('HDEL', key, 'r')
  s.res = nil
end
keep(key, s.fence, sem_end(s))
if ARGV[2] == 's' then redis.call('SPUBLISH', key, '')
elseif ARGV[2] == 'p' then redis.call('PUBLISH', key, '') end
return s.limit or 0
