-- semaphore_release: release this owner's permits, or withdraw this waiter's reservation
-- (own_prologue.lua first; semaphore.lua is inlined at each `--@sem` line, inside the blocks of
-- the rare paths: a release without permit numbers, more than 512 arguments to one command; a
-- release of numbered permits defines no function, and one of a single number, the common case,
-- builds no table).
--
-- KEYS[1] the semaphore key. ARGV[1] owner token (or waiter id), ARGV[2] the permit numbers, space
-- separated: the hold id of the held contract (empty: every permit this owner holds), ARGV[3]
-- announce: `s` SPUBLISH, `p` PUBLISH, empty for none (the channel is the semaphore key), ARGV[4]
-- expiry grace.
--
-- A released permit's entry keeps its owner and fence with lease end 0, so a resent release
-- answers 1 again (until an acquire deletes the dead entry, or grants the number again: then
-- 0 or -1); the owner's `o:` index and a reservation of ARGV[1] are removed, and on a key with
-- the index (see semaphore.lua) the released numbers go to the front of `free`. With
-- permit numbers it reads only their entries (one `HMGET` with the index: O(count)),
-- without them (an undo of a cut acquire, a withdrawn reservation) first the owner's `o:`
-- index, then the live entries it names that are still the owner's; it never changes the
-- key's expiry (it only frees, so the expiry the last grant or renewal set still covers every
-- live entry). Anything freed is announced when `waiters` is set (a refused acquire set it),
-- and `waiters` is removed with it: without a refused acquire nothing is published (an older
-- client's waiter, whose acquire does not set it, waits for its retry timer).
--
-- Replies: 1 released (or released before, or a reservation withdrawn); 0 unknown or expired
-- permits (nothing changed); -1 a permit is now held by another owner (left alone); -2 (before
-- -1/0) nothing was released and `forced` names this owner: a forced unlock freed its permits
-- (see semaphore_force_unlock.lua). allow-oom.
#!lua flags=allow-oom
local key, owner = KEYS[1], ARGV[1]
local values, targets
local released, before, expired, other = 0, 0, 0, 0
if ARGV[2] ~= '' and not string.find(ARGV[2], ' ', 1, true) then
  -- One numbered permit (the common case): no table built but the reply of the `HMGET`.
  local n = ARGV[2]
  values = redis.call('HMGET', key, 'r', 'o:' .. owner, 'free', 'sf', 'waiters', 'p:' .. n)
  targets = 1
  -- the entry, parsed as sem_parse_permit does (semaphore.lua): owner, lease end, fence
  local v, po, pe, pf = values[6]
  local at = v and string.find(v, ' ', 1, true)
  if at and at > 1 then
    local e, f = string.match(v, '^(%d+) (%d+)$', at + 1)
    if e then po, pe, pf = string.sub(v, 1, at - 1), e + 0, f end
  end
  if po == owner and pe > now_ms then
    released = 1
    if values[4] and values[4] ~= '' then
      local free = n
      if values[3] and values[3] ~= '' then free = n .. ' ' .. values[3] end
      redis.call('HSET', key, 'p:' .. n, owner .. ' 0 ' .. pf, 'free', free)
    else
      redis.call('HSET', key, 'p:' .. n, owner .. ' 0 ' .. pf)
    end
  elseif po == owner and pe == 0 then
    before = 1
  elseif po and pe > now_ms then
    other = 1
  else
    expired = 1
  end
else
  local fields, numbers = {'r', 'o:' .. owner, 'free', 'sf', 'waiters'}, {}
  for n in string.gmatch(ARGV[2], '%d+') do
    numbers[#numbers + 1] = n
    fields[#fields + 1] = 'p:' .. n
  end
  if #fields <= 512 then
    values = redis.call('HMGET', key, unpack(fields))
  else
--@sem
    values = sem_call('HMGET', key, fields)
  end
  local mine
  if ARGV[2] == '' and values[2] then
--@sem
    local _, live = sem_mine(key, owner .. ' ' .. values[2])
    mine = live
    for i, p in ipairs(mine) do numbers[i] = p.n end
  end
  -- Each target's entry, parsed as sem_parse_permit does (semaphore.lua).
  local writes, freed = {}, {}
  for i, n in ipairs(numbers) do
    local po, pe, pf
    if mine then
      po, pe, pf = mine[i].owner, mine[i].ends, mine[i].fence
    else
      local v = values[i + 5]
      local at = v and string.find(v, ' ', 1, true)
      if at and at > 1 then
        local e, f = string.match(v, '^(%d+) (%d+)$', at + 1)
        if e then po, pe, pf = string.sub(v, 1, at - 1), e + 0, f end
      end
    end
    if po == owner and pe > now_ms then
      writes[#writes + 1] = 'p:' .. n
      writes[#writes + 1] = owner .. ' 0 ' .. pf
      freed[#freed + 1] = n
      released = released + 1
    elseif po == owner and pe == 0 then
      before = before + 1
    elseif po and pe > now_ms then
      other = other + 1
    else
      expired = expired + 1
    end
  end
  if released > 0 and values[4] and values[4] ~= '' then
    local free = table.concat(freed, ' ')
    if values[3] and values[3] ~= '' then free = free .. ' ' .. values[3] end
    writes[#writes + 1] = 'free'
    writes[#writes + 1] = free
  end
  if #writes > 512 then
--@sem
    sem_call('HSET', key, writes)
  elseif #writes > 0 then
    redis.call('HSET', key, unpack(writes))
  end
  targets = #numbers
end
local withdrawn = values[1] and string.match(values[1], '^(%S+) %d+ %d+$') == owner
local announce = values[5] and (released > 0 or withdrawn)
if withdrawn or announce then
  local gone = {}
  if withdrawn then gone[1] = 'r' end
  if values[2] then gone[#gone + 1] = 'o:' .. owner end
  if announce then gone[#gone + 1] = 'waiters' end
  redis.call('HDEL', key, unpack(gone))
  if announce then
    if ARGV[3] == 's' then redis.call('SPUBLISH', key, '')
    elseif ARGV[3] == 'p' then redis.call('PUBLISH', key, '') end
  end
elseif values[2] then
  redis.call('HDEL', key, 'o:' .. owner)
end
if released > 0 or (withdrawn and targets == 0) then return 1 end
if before > 0 and expired == 0 and other == 0 then return 1 end
-- `forced` names this owner (as sem_forced, semaphore.lua)
local list = redis.call('HGET', key, 'forced')
if list and string.find(' ' .. list .. ' ', ' ' .. owner .. ' ', 1, true) then return -2 end
if other > 0 then return -1 end
return 0
