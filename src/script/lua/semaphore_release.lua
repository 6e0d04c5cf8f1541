-- semaphore_release: release this owner's permits, or withdraw this waiter's reservation
-- (own_prologue.lua, semaphore.lua and semaphore_hold.lua first).
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
-- live entry). Anything freed is announced.
--
-- Replies: 1 released (or released before, or a reservation withdrawn); 0 unknown or expired
-- permits (nothing changed); -1 a permit is now held by another owner (left alone); -2 (before
-- -1/0) nothing was released and `forced` names this owner: a forced unlock freed its permits
-- (see semaphore_force_unlock.lua). allow-oom.
#!lua flags=allow-oom
local key, owner = KEYS[1], ARGV[1]
local fields = {'r', 'o:' .. owner, 'free', 'sf'}
local targets, found = {}, {}
if ARGV[2] ~= '' and not string.find(ARGV[2], ' ', 1, true) then
  targets[1] = ARGV[2]
  fields[5] = 'p:' .. ARGV[2]
else
  for n in string.gmatch(ARGV[2], '%d+') do
    targets[#targets + 1] = n
    fields[#fields + 1] = 'p:' .. n
  end
end
local values = sem_call('HMGET', key, fields)
local res = sem_parse_res(values[1])
for i, n in ipairs(targets) do found[n] = sem_parse_permit(n, values[i + 4]) end
if ARGV[2] == '' and values[2] then
  local _, mine = sem_mine(key, owner .. ' ' .. values[2])
  for _, p in ipairs(mine) do
    targets[#targets + 1] = p.n
    found[p.n] = p
  end
end
local released, before, expired, other = 0, 0, 0, 0
local writes, freed = {}, {}
for _, n in ipairs(targets) do
  local p = found[n]
  if p and p.owner == owner and p.live then
    writes[#writes + 1] = 'p:' .. n
    writes[#writes + 1] = owner .. ' 0 ' .. p.fence
    freed[#freed + 1] = n
    released = released + 1
  elseif p and p.owner == owner and p.ends == 0 then
    before = before + 1
  elseif p and p.live then
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
sem_call('HSET', key, writes)
local withdrawn = res ~= nil and res.owner == owner
if withdrawn then redis.call('HDEL', key, 'r', 'o:' .. owner)
elseif values[2] then redis.call('HDEL', key, 'o:' .. owner) end
if released > 0 or withdrawn then
  if ARGV[3] == 's' then redis.call('SPUBLISH', key, '')
  elseif ARGV[3] == 'p' then redis.call('PUBLISH', key, '') end
end
if released > 0 or (withdrawn and #targets == 0) then return 1 end
if before > 0 and expired == 0 and other == 0 then return 1 end
if sem_forced(key, owner) then return -2 end
if other > 0 then return -1 end
return 0
