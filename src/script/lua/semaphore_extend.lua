-- semaphore_extend: move the lease end of this owner's live permits to now + TTL (prologue,
-- fence rule and semaphore state first).
--
-- KEYS[1] the semaphore key. ARGV[1] owner token, ARGV[2] TTL in ms, ARGV[3] expiry grace.
--
-- Replies: {1, TTL ms} extended; {0, 0} no live permit of this owner (expired or unknown).
-- allow-oom.
#!lua flags=allow-oom
local key, owner = KEYS[1], ARGV[1]
local s = sem_read(key)
local ends = now_ms + tonumber(ARGV[2])
local any = false
for _, p in ipairs(s.permits) do
  if p.live and p.owner == owner then
    redis.call('HSET', key, 'p:' .. p.n, sem_permit(owner, ends, p.fence))
    p.ends = ends
    any = true
  end
end
if not any then return {0, 0} end
keep(key, s.fence, sem_end(s))
return {1, tonumber(ARGV[2])}
