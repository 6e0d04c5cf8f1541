-- semaphore_extend: move the lease end of this owner's live permits to now + TTL (own_prologue.lua,
-- semaphore.lua and semaphore_hold.lua first).
--
-- KEYS[1] the semaphore key. ARGV[1] the holder: "<owner token> <n1> <n2> ...", its permit
-- numbers (the hold id) after the token, ARGV[2] TTL in ms, ARGV[3] expiry grace.
--
-- Reads only those permits' entries, O(their count); the key's expiry is only raised, to
-- cover the new lease end.
--
-- Replies: {1, TTL ms} extended; {0, 0} no live permit of this owner (expired or unknown);
-- {-2, 0} none, and `forced` names the owner: a forced unlock freed its permits (see
-- semaphore_force_unlock.lua). allow-oom.
#!lua flags=allow-oom
local key = KEYS[1]
local ends = now_ms + ARGV[2]
local owner, mine = sem_mine(key, ARGV[1])
local fields = {}
for _, p in ipairs(mine) do
  fields[#fields + 1] = 'p:' .. p.n
  fields[#fields + 1] = sem_permit(owner, ends, p.fence)
end
if #fields == 0 then
  if sem_forced(key, owner) then return {-2, 0} end
  return {0, 0}
end
sem_call('HSET', key, fields)
sem_raise(key, ends)
return {1, tonumber(ARGV[2])}
