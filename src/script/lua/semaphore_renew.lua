-- semaphore_renew: extend many owners' permits on one node in one call (the watchdog's batch;
-- own_prologue.lua, semaphore.lua and semaphore_hold.lua first).
--
-- KEYS[1] one of the semaphore keys (routes the call). ARGV triples: semaphore key, holder
-- ("<owner token> <n1> <n2> ...", as for semaphore_extend), TTL in ms (keys of any slots this node serves, allow-cross-slot-keys), then the expiry
-- grace as the last ARGV. Each owner's live permits are set as semaphore_extend sets them,
-- reading only that owner's entries: a triple costs O(its permits).
--
-- Replies: one code per triple: 1 extended, 0 no live permit of this owner, -2 none, and
-- `forced` names the owner: a forced unlock freed its permits (see semaphore_force_unlock.lua).
-- allow-oom.
#!lua flags=allow-oom,allow-cross-slot-keys
local codes = {}
for i = 1, #ARGV - 1, 3 do
  local key = ARGV[i]
  local ends = now_ms + ARGV[i + 2]
  local owner, mine = sem_mine(key, ARGV[i + 1])
  local fields = {}
  for _, p in ipairs(mine) do
    fields[#fields + 1] = 'p:' .. p.n
    fields[#fields + 1] = sem_permit(owner, ends, p.fence)
  end
  local code = 0
  if #fields > 0 then
    sem_call('HSET', key, fields)
    sem_raise(key, ends)
    code = 1
  elseif sem_forced(key, owner) then
    code = -2
  end
  codes[#codes + 1] = code
end
return codes
