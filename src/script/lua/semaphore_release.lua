-- semaphore_release: release this owner's permits, or withdraw this waiter's reservation
-- (prologue, fence rule and semaphore state first).
--
-- KEYS[1] the semaphore key. ARGV[1] owner token (or waiter id), ARGV[2] the permit numbers,
-- space separated (empty: every permit this owner holds), ARGV[3] announce: `s` SPUBLISH, `p`
-- PUBLISH, empty for none (the channel is the semaphore key), ARGV[4] expiry grace.
--
-- A released permit's entry keeps its owner and fence with lease end 0, so a resent release
-- answers 1 again; a reservation of ARGV[1] is removed. Anything freed is announced.
--
-- Replies: 1 released (or released before, or a reservation withdrawn); 0 unknown or expired
-- permits (nothing changed); -1 a permit is now held by another owner (left alone). allow-oom.
#!lua flags=allow-oom
local key, owner = KEYS[1], ARGV[1]
local s = sem_read(key)
local by_number = {}
local targets = {}
for _, p in ipairs(s.permits) do
  by_number[p.n] = p
  if ARGV[2] == '' and p.owner == owner and p.live then targets[#targets + 1] = p.n end
end
for n in string.gmatch(ARGV[2], '%d+') do targets[#targets + 1] = tonumber(n) end
local released, before, expired, other = 0, 0, 0, 0
for _, n in ipairs(targets) do
  local p = by_number[n]
  if p and p.owner == owner and p.live then
    redis.call('HSET', key, 'p:' .. n, sem_permit(owner, 0, p.fence))
    p.live = false
    released = released + 1
  elseif p and p.owner == owner and p.ends == 0 then
    before = before + 1
  elseif p and p.live then
    other = other + 1
  else
    expired = expired + 1
  end
end
local withdrawn = s.res ~= nil and s.res.owner == owner
if withdrawn then
  redis.call('HDEL', key, 'r')
  s.res = nil
end
if released > 0 or withdrawn then
  keep(key, s.fence, sem_end(s))
  if ARGV[3] == 's' then redis.call('SPUBLISH', key, '')
  elseif ARGV[3] == 'p' then redis.call('PUBLISH', key, '') end
end
if released > 0 or (withdrawn and #targets == 0) then return 1 end
if before > 0 and expired == 0 and other == 0 then return 1 end
if other > 0 then return -1 end
return 0
