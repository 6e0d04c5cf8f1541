-- semaphore_force_unlock: an operator frees every live permit of a semaphore (prologue, fence
-- rule, semaphore state and the inspection snippet first). A live permit's entry is deleted,
-- so its holder's release answers 0 (expired) rather than "released before"; `fence` and
-- `limit` stay, so later permits get higher fences; a waiter's reservation stays. The key's
-- expiry follows the rule (now, or a live reservation's end), and the freed permits are
-- announced on the semaphore's channel.
--
-- KEYS[1] the semaphore key. ARGV[1] announce (`s`, `p`, empty), ARGV[2] open TTL ms
-- (unused), ARGV[3] expiry grace.
--
-- Replies: the inspection of the state it found, before freeing it. allow-oom.
#!lua flags=allow-oom
local before = inspect('sem')
local s = sem_read(KEYS[1])
local fields = {}
for _, p in ipairs(s.permits) do
  if p.live then fields[#fields + 1] = 'p:' .. p.n end
end
local freed = #fields
sem_call('HDEL', KEYS[1], fields)
if freed > 0 then
  local ends = now_ms
  if s.res and s.res.live and s.res.ends > ends then ends = s.res.ends end
  keep(KEYS[1], s.fence, ends)
  if ARGV[1] == 's' then redis.call('SPUBLISH', KEYS[1], '')
  elseif ARGV[1] == 'p' then redis.call('PUBLISH', KEYS[1], '') end
end
return before
