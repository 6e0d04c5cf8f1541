-- semaphore_set_limit: store a new limit (prologue, fence rule and semaphore state first).
-- Permits held above a lowered limit stay until released or expired, and count against it.
--
-- KEYS[1] the semaphore key. ARGV[1] the new limit, ARGV[2] announce (`s`, `p` or empty, as for
-- release: a raised limit may let waiters in), ARGV[3] expiry grace.
--
-- Replies: the limit stored before (0 when none was). Not allow-oom.
#!lua
local key = KEYS[1]
local s = sem_read(key)
redis.call('HSET', key, 'limit', ARGV[1])
keep(key, s.fence, sem_end(s))
if ARGV[2] == 's' then redis.call('SPUBLISH', key, '')
elseif ARGV[2] == 'p' then redis.call('PUBLISH', key, '') end
return s.limit or 0
