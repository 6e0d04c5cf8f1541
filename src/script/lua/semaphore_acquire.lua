-- semaphore_acquire: take `count` permits of a semaphore for one owner, all or none (own_prologue.lua
-- and the fence rule first; own_keep.lua, semaphore.lua and semaphore_scan.lua are inlined at
-- each `--@sem` line, inside the blocks of the rare paths: a resent acquire, the scan, a grant of
-- more than one permit; a one-permit grant from the index defines none of their functions).
--
-- KEYS[1] the semaphore key (hash). ARGV[1] owner token, ARGV[2] count, ARGV[3] limit (the
-- caller's; the first use stores it), ARGV[4] TTL in ms, ARGV[5] floor (decimal, 0 for none),
-- ARGV[6] fence mode (as acquire), ARGV[7] waiter id: a waiting call's id that
-- may reserve the permits it waits for (empty: no reservation), ARGV[8] expiry grace.
--
-- Takes `count` free numbers below the limit (absent, expired or released) and grants each its
-- own fence, consecutive from the `fence` counter (the first by the fence rule, as acquire's).
-- With a trusted index (see semaphore.lua) it reads one `HMGET` (the limit, the reservation,
-- the index, `o:<owner>`), takes numbers from `free`, then from `top`, and writes one `HSET`:
-- O(count), whatever the limit and the permits held. Else (no trusted index, too few numbers
-- in it: then expired permits may be reclaimed) it scans every entry as before, takes the
-- lowest free numbers and writes the index afresh. While another waiter's
-- live reservation exists, a request is granted only if the reservation can still be met
-- after it; a reservation for more permits than the limit can never be met and blocks no one.
-- A refused request of a waiter for more than one permit reserves them (`r`) unless another
-- waiter's live reservation exists; granting the reserving waiter removes it. Every refusal
-- on a stored semaphore sets `waiters` (`HSETNX`, in the reservation's `HSET` when it
-- reserves), so that the next release announces (see semaphore_release.lua). A scan deletes
-- every dead entry it reads (expired or released) that it does not reuse, and the `o:` fields
-- of owners without a live permit, so the hash holds the live permits plus those that died
-- since: a scan costs O(entries + count), entries at most the limit plus what outlives a
-- lowered one. The key's expiry is only raised by a grant (as `sem_expire`, inlined). The client keeps
-- count <= limit <= MAX_PERMITS (src/semaphore/mod.rs).
--
-- Replies:
-- - {1, fence1, behind, n1, fence1, n2, fence2, ...} granted (the first permit's fence, then
--   behind as for acquire: the layout every granting script shares, src/acquire/grant.rs);
-- - {2, fence1, 0, n1, fence1, ...} this owner already holds permits (a resent script): the
--   permits granted then, nothing changed;
-- - {0, retry after ms, available} not enough free permits (or they are reserved); the index
--   is written afresh only where the scan found it off (a refusal on a key with a sound index
--   writes only `waiters`, and nothing when it is set already);
-- - {-1, stored limit} the semaphore has another limit (no write);
-- - an error reply (no write) as for acquire's fence rule.
-- Not allow-oom: refused with OOM at maxmemory.
#!lua
local key, owner, waiter = KEYS[1], ARGV[1], ARGV[7]
local count, limit, ttl = ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0
local c = redis.call('HMGET', key, 'limit', 'r', 'top', 'free', 'sf', 'o:' .. owner, 'fence')
local stored = tonumber(c[1])
if stored and stored ~= limit then return {-1, stored} end
local stamp = ' ' .. ARGV[3]
if limit > 32 then stamp = stamp .. ' ' .. string.rep('-', 64) end
if c[6] then
--@sem
  local _, mine = sem_mine(key, owner .. ' ' .. c[6])
  if #mine > 0 then return sem_held(mine) end
end
-- the reservation, parsed as sem_parse_res does (semaphore.lua)
local res
if c[2] then
  local o, n, e = string.match(c[2], '^(%S+) (%d+) (%d+)$')
  if o then res = {owner = o, count = n + 0, ends = e + 0, live = e + 0 > now_ms} end
end
local reserved = res and res.owner == waiter
if res and res.count > limit then res = nil end
local blocked = res and res.live and res.owner ~= waiter
local top, free = tonumber(c[3]), c[4] or ''
if not stored then
  top, free = 0, ''
elseif c[5] ~= (c[7] or '') .. stamp then
  top = nil
end
local numbers, index, one, itop, ifree
if top and count == 1 then
  -- One permit from the index (the common case), without a table: `one` the number taken,
  -- `ifree` and `itop` the index fields as they stand after it (nil: unchanged).
  while free ~= '' do
    local n, rest = string.match(free, '^(%d+) ?(.*)$')
    free = rest or ''
    if n and n + 0 < limit then
      one = n
      break
    end
  end
  if free ~= (c[4] or '') then ifree = free end
  if not one and top < limit then
    one = stored and c[3] or '0'
    top = top + 1
    itop = string.format('%d', top)
  end
  if one and blocked then
    -- the reservation must still be met: count what is left free below the limit
    local left = limit - top
    for n in string.gmatch(free, '%d+') do
      if n + 0 < limit then left = left + 1 end
    end
    if left < res.count then one = nil end
  end
elseif top then
  numbers, index = {}, {}
  while #numbers < count and free ~= '' do
    local n, rest = string.match(free, '^(%d+) ?(.*)$')
    free = rest or ''
    if n and tonumber(n) < limit then numbers[#numbers + 1] = n end
  end
  if free ~= (c[4] or '') then
    index[1], index[2] = 'free', free
  end
  local from = top
  while #numbers < count and top < limit do
    numbers[#numbers + 1] = string.format('%d', top)
    top = top + 1
  end
  if top ~= from then
    index[#index + 1] = 'top'
    index[#index + 1] = string.format('%d', top)
  end
  local enough = #numbers == count
  if enough and blocked then
    -- the reservation must still be met: count what is left free below the limit
    local left = limit - top
    for n in string.gmatch(free, '%d+') do
      if tonumber(n) < limit then left = left + 1 end
    end
    enough = left >= res.count
  end
  if not enough then numbers = nil end
end
if not (one or numbers) then
  -- The scan: every entry, the exact state, the index written afresh.
--@sem
  local s = sem_read(key)
  local mine, used, taken, earliest, dead, holders, high = {}, {}, 0, nil, {}, {}, -1
  for _, p in ipairs(s.permits) do
    if p.live then
      used[p.n] = true
      holders[p.owner] = true
      taken = taken + 1
      if p.n > high then high = p.n end
      if p.owner == owner then mine[#mine + 1] = p end
      if not earliest or p.ends < earliest then earliest = p.ends end
    else
      dead[#dead + 1] = p.n
    end
  end
  if #mine > 0 then return sem_held(mine) end
  local function sweep(reused)
    local fields = {}
    for _, n in ipairs(dead) do
      if not (reused and reused[n]) then fields[#fields + 1] = 'p:' .. n end
    end
    for _, o in ipairs(s.index) do
      if not holders[o] then fields[#fields + 1] = 'o:' .. o end
    end
    sem_call('HDEL', key, fields)
  end
  -- sweep_index(also): the index fields after the numbers `also` (a set) are granted too:
  -- `top` one above the highest number in use, `free` the unused ones below it; `untrusted`
  -- (written as an empty `sf`) while a live number is at or above the limit.
  local function sweep_index(also)
    local top = high
    for n in pairs(also) do
      if n > top then top = n end
    end
    local list = {}
    for n = 0, top do
      if not used[n] and not also[n] then list[#list + 1] = n end
    end
    return {'top', top + 1, 'free', table.concat(list, ' '), untrusted = high >= limit}
  end
  local need = count
  if blocked then need = count + res.count end
  local available = limit - taken
  if available < need then
    sweep(nil)
    local fresh = sweep_index({})
    fresh[#fresh + 1] = 'sf'
    fresh[#fresh + 1] = high < limit and ((c[7] or '') .. stamp) or ''
    if not (tonumber(c[3]) == fresh[2] and (c[4] or '') == fresh[4] and c[5] == fresh[6]) then
      redis.call('HSET', key, unpack(fresh))
    end
    local wake = earliest
    if blocked and (not wake or res.ends < wake) then wake = res.ends end
    local retry = (wake or now_ms) - now_ms
    if waiter ~= '' and count > 1 and not blocked then
      local ends = now_ms + ttl
      redis.call('HSET', key, 'limit', limit,
        'r', waiter .. ' ' .. count .. ' ' .. string.format('%d', ends), 'waiters', '1')
      s.res = {owner = waiter, count = count, ends = ends, live = true}
      keep(key, s.fence, sem_end(s))
      local half = math.ceil(ttl / 2)
      if retry > half then retry = half end
    elseif stored then
      redis.call('HSETNX', key, 'waiters', '1')
    end
    if available < 0 then available = 0 end
    return {0, retry, available}
  end
  local reused, n = {}, 0
  numbers = {}
  for _ = 1, count do
    while used[n] do n = n + 1 end
    reused[n] = true
    numbers[#numbers + 1] = tostring(n)
    n = n + 1
  end
  sweep(reused)
  index = sweep_index(reused)
end
-- The grant: the permit `one` with the index fields `itop`, `ifree` (one permit from the index,
-- the common case: one `HSET` of its arguments, no table), else the permits `numbers` (decimal
-- strings), each with its fence, and the index fields in `index` as they stand after it (one
-- permit written with one table constructor: no number turned into a string twice, no table
-- grown field by field).
local fence, behind = next_fence(tonumber(c[7]) or 0, ARGV[5], ARGV[6], count, KEYS[1])
if not fence then return behind end
local ends = now_ms + ttl
local last = string.format('%d', fence + count - 1)
local reply
if one then
  local o, p, e = 'o:' .. owner, 'p:' .. one, string.format('%s %d %s', owner, ends, last)
  local sf = last .. stamp
  if not stored and ifree then
    redis.call('HSET', key, 'fence', last, 'sf', sf, o, one, p, e, 'top', itop, 'limit', ARGV[3],
      'free', ifree)
  elseif not stored then
    redis.call('HSET', key, 'fence', last, 'sf', sf, o, one, p, e, 'top', itop, 'limit', ARGV[3])
  elseif itop and ifree then
    redis.call('HSET', key, 'fence', last, 'sf', sf, o, one, p, e, 'top', itop, 'free', ifree)
  elseif itop then
    redis.call('HSET', key, 'fence', last, 'sf', sf, o, one, p, e, 'top', itop)
  elseif ifree then
    redis.call('HSET', key, 'fence', last, 'sf', sf, o, one, p, e, 'free', ifree)
  else
    redis.call('HSET', key, 'fence', last, 'sf', sf, o, one, p, e)
  end
  reply = {1, fence, behind, one + 0, fence}
elseif count == 1 then
  local sf = index.untrusted and '' or last .. stamp
  local n = numbers[1]
  local w = {'fence', last, 'sf', sf, 'o:' .. owner, n, 'p:' .. n,
    string.format('%s %d %s', owner, ends, last), index[1], index[2], index[3], index[4]}
  if not stored then
    w[#w + 1] = 'limit'
    w[#w + 1] = ARGV[3]
  end
  redis.call('HSET', key, unpack(w))
  reply = {1, fence, behind, n + 0, fence}
else
--@sem
  local sf = index.untrusted and '' or last .. stamp
  reply = {1, fence, behind}
  local k = #index
  index[k + 1], index[k + 2], index[k + 3], index[k + 4] = 'fence', last, 'sf', sf
  index[k + 5], index[k + 6] = 'o:' .. owner, table.concat(numbers, ' ')
  if not stored then
    index[k + 7], index[k + 8] = 'limit', ARGV[3]
  end
  for i, n in ipairs(numbers) do
    index[#index + 1] = 'p:' .. n
    index[#index + 1] = sem_permit(owner, ends, fence + i - 1)
    reply[#reply + 1] = n + 0
    reply[#reply + 1] = fence + i - 1
  end
  sem_call('HSET', key, index)
end
if reserved then redis.call('HDEL', key, 'r') end
-- the expiry, as sem_expire(key, not stored, fence + count - 1, ends) (semaphore_scan.lua)
if not grace then
  redis.call('PERSIST', key)
else
  if memo.shift then
    local fence_ms = math.ceil((fence + count - 1 - memo.shift) / 1000)
    if fence_ms > ends then ends = fence_ms end
  end
  if stored then
    redis.call('PEXPIREAT', key, string.format('%d', ends + grace), 'GT')
  else
    redis.call('PEXPIREAT', key, string.format('%d', ends + grace))
  end
end
return reply
