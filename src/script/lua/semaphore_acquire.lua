-- semaphore_acquire: take `count` permits of a semaphore for one owner, all or none (prologue,
-- fence rule and semaphore state first).
--
-- KEYS[1] the semaphore key (hash). ARGV[1] owner token, ARGV[2] count, ARGV[3] limit (the
-- caller's; the first use stores it), ARGV[4] TTL in ms, ARGV[5] floor (decimal, 0 for none),
-- ARGV[6] fence mode (as acquire), ARGV[7] waiter id: a waiting call's id that
-- may reserve the permits it waits for (empty: no reservation), ARGV[8] expiry grace.
--
-- Takes the `count` lowest numbers below the limit that are free (absent, expired or released)
-- and grants each its own fence, consecutive from the `fence` counter (the first by the fence
-- rule, as acquire's). While another waiter's
-- live reservation exists, a request is granted only if the reservation can still be met
-- after it; a reservation for more permits than the limit can never be met and blocks no one.
-- A refused request of a waiter for more than one permit reserves them (`r`) unless another
-- waiter's live reservation exists; granting the reserving waiter removes it. Every dead
-- entry it reads (expired or released) that it does not reuse is deleted, so the hash holds
-- the live permits plus those that died since the last acquire: the call costs O(entries +
-- count), entries at most the limit plus what outlives a lowered one, never a scan of 0..limit.
-- The client keeps count <= limit <= MAX_PERMITS (src/semaphore/mod.rs).
--
-- Replies:
-- - {1, fence1, behind, n1, fence1, n2, fence2, ...} granted (the first permit's fence, then
--   behind as for acquire: the layout every granting script shares, src/acquire/grant.rs);
-- - {2, fence1, 0, n1, fence1, ...} this owner already holds permits (a resent script): the
--   permits granted then, nothing changed;
-- - {0, retry after ms, available} not enough free permits (or they are reserved);
-- - {-1, stored limit} the semaphore has another limit (no write);
-- - an error reply (no write) as for acquire's fence rule.
-- Not allow-oom: refused with OOM at maxmemory.
#!lua
local key, owner, waiter = KEYS[1], ARGV[1], ARGV[7]
local count, limit, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local s = sem_read(key)
if s.limit and s.limit ~= limit then return {-1, s.limit} end
local mine, used, taken, earliest, dead = {}, {}, 0, nil, {}
for _, p in ipairs(s.permits) do
  if p.live then
    used[p.n] = true
    taken = taken + 1
    if p.owner == owner then mine[#mine + 1] = p end
    if not earliest or p.ends < earliest then earliest = p.ends end
  else
    dead[#dead + 1] = p.n
  end
end
if #mine > 0 then
  table.sort(mine, function(a, b) return a.n < b.n end)
  local reply = {2, tonumber(mine[1].fence), 0}
  for _, p in ipairs(mine) do
    reply[#reply + 1] = p.n
    reply[#reply + 1] = tonumber(p.fence)
  end
  return reply
end
local function sweep(reused)
  local fields = {}
  for _, n in ipairs(dead) do
    if not (reused and reused[n]) then fields[#fields + 1] = 'p:' .. n end
  end
  sem_call('HDEL', key, fields)
end
local free = limit - taken
local res = s.res
if res and res.count > limit then res = nil end
local blocked = res and res.live and res.owner ~= waiter
local need = count
if blocked then need = count + res.count end
if free >= need then
  local fence, behind = next_fence(s.fence, ARGV[5], ARGV[6], count)
  if not fence then return behind end
  local ends = now_ms + ttl
  local last = fence + count - 1
  local reply = {1, fence, behind}
  local fields = {'limit', limit, 'fence', string.format('%.0f', last)}
  local reused = {}
  local n = 0
  for i = 1, count do
    while used[n] do n = n + 1 end
    reused[n] = true
    fields[#fields + 1] = 'p:' .. n
    fields[#fields + 1] = sem_permit(owner, ends, fence + i - 1)
    reply[#reply + 1] = n
    reply[#reply + 1] = fence + i - 1
    n = n + 1
  end
  sweep(reused)
  sem_call('HSET', key, fields)
  if s.res and s.res.owner == waiter then
    redis.call('HDEL', key, 'r')
    s.res = nil
  end
  local keep_until = sem_end(s)
  if ends > keep_until then keep_until = ends end
  keep(key, last, keep_until)
  return reply
end
sweep(nil)
local wake = earliest
if blocked and (not wake or res.ends < wake) then wake = res.ends end
local retry = (wake or now_ms) - now_ms
if waiter ~= '' and count > 1 and not blocked then
  local ends = now_ms + ttl
  redis.call('HSET', key, 'limit', limit, 'r', waiter .. ' ' .. count .. ' ' .. string.format('%.0f', ends))
  s.res = {owner = waiter, count = count, ends = ends, live = true}
  keep(key, s.fence, sem_end(s))
  local half = math.ceil(ttl / 2)
  if retry > half then retry = half end
end
if free < 0 then free = 0 end
return {0, retry, free}
