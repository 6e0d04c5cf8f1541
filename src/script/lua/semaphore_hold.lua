-- The semaphore's helpers for a holder's own permits (after semaphore.lua; they run once per
-- script call, above the `--@key` line), for semaphore_release, semaphore_extend and
-- semaphore_renew.
--
-- `sem_forced` and `sem_raise` as semaphore.lua describes them.
local function sem_forced(key, owner)
  local list = redis.call('HGET', key, 'forced')
  return list and string.find(' ' .. list .. ' ', ' ' .. owner .. ' ', 1, true) ~= nil or false
end
local function sem_raise(key, ends)
  if not grace then return redis.call('PERSIST', key) end
  local target = string.format('%d', ends + grace)
  if redis.call('PEXPIREAT', key, target, 'GT') == 0 and redis.call('PEXPIRETIME', key) == -1 then
    redis.call('PEXPIREAT', key, target)
  end
end
--@key
