-- rw_force_unlock: an operator frees a read-write lock whoever holds it (lock prologue, fence
-- rule, rw prologue and the inspection snippet first). The writer and every reader go, with
-- their hold counts and hold fields; the fence stays; a waiting writer's intent stays (it is
-- a waiter, not a hold, and lapses on its own). When the key is left without holders it
-- expires by the usual rule (`settle`), and the release is announced on the lock's channel.
--
-- KEYS[1] the lock's hash. ARGV[1] announce (`s`, `p`, empty), ARGV[2] open TTL ms (unused),
-- ARGV[3] expiry grace.
--
-- Replies: the inspection of the state it found, before freeing it. allow-oom.
#!lua flags=allow-oom
local before = inspect('rw')
local freed = 0
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  local head = string.sub(field, 1, 2)
  if field == 'w' or field == 'wu' or field == 'rs' or head == 'r:' or head == 'c:' or head == 'h:' then
    redis.call('HDEL', KEYS[1], field)
    freed = freed + 1
  end
end
if freed > 0 then
  settle()
  if before[2] == 1 then announce(ARGV[1]) end
end
return before
