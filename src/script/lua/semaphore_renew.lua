-- semaphore_renew: extend many owners' permits on one node in one call (the watchdog's batch;
-- prologue, fence rule and semaphore state first).
--
-- KEYS[1] one of the semaphore keys (routes the call). ARGV triples: semaphore key, owner
-- token, TTL in ms (keys of any slots this node serves, allow-cross-slot-keys), then the expiry
-- grace as the last ARGV. Each owner's live permits are set as semaphore_extend sets them.
--
-- Replies: one code per triple: 1 extended, 0 no live permit of this owner. allow-oom.
#!lua flags=allow-oom,allow-cross-slot-keys
local codes = {}
for i = 1, #ARGV - 1, 3 do
  local key, owner = ARGV[i], ARGV[i + 1]
  local s = sem_read(key)
  local ends = now_ms + tonumber(ARGV[i + 2])
  local code = 0
  for _, p in ipairs(s.permits) do
    if p.live and p.owner == owner then
      redis.call('HSET', key, 'p:' .. p.n, sem_permit(owner, ends, p.fence))
      p.ends = ends
      code = 1
    end
  end
  if code == 1 then keep(key, s.fence, sem_end(s)) end
  codes[#codes + 1] = code
end
return codes
