-- semaphore_force_unlock: an operator frees every live permit of a semaphore (own_prologue.lua,
-- own_keep.lua, semaphore.lua, semaphore_scan.lua and inspect.lua first). A live permit's entry is deleted;
-- `fence` and `limit` stay, so later permits get higher fences; a waiter's reservation stays.
-- The freed permits' owners (each once, space separated: at most `MAX_PERMITS` tokens) replace
-- `forced`, so a freed holder's next release, extend or renewal answers -2 (freed by a forced
-- unlock) rather than 0 (expired); `forced` is no permit (inspection, acquire and the expiry
-- rule ignore it) and goes with the key. The key's expiry follows the rule (now, or a live
-- reservation's end), and the freed permits are announced on the semaphore's channel.
--
-- KEYS[1] the semaphore key. ARGV[1] announce (`s`, `p`, empty), ARGV[2] open TTL ms
-- (unused), ARGV[3] expiry grace.
--
-- Replies: the inspection of the state it found, before freeing it. allow-oom.
#!lua flags=allow-oom
local before = inspect('sem')
local s = sem_read(KEYS[1])
local fields, owners, seen = {}, {}, {}
for _, p in ipairs(s.permits) do
  if p.live then
    fields[#fields + 1] = 'p:' .. p.n
    if not seen[p.owner] then
      seen[p.owner] = true
      owners[#owners + 1] = p.owner
    end
  end
end
local freed = #fields
sem_call('HDEL', KEYS[1], fields)
if freed > 0 then
  redis.call('HSET', KEYS[1], 'forced', table.concat(owners, ' '))
  local ends = now_ms
  if s.res and s.res.live and s.res.ends > ends then ends = s.res.ends end
  keep(KEYS[1], s.fence, ends)
  if ARGV[1] == 's' then redis.call('SPUBLISH', KEYS[1], '')
  elseif ARGV[1] == 'p' then redis.call('PUBLISH', KEYS[1], '') end
end
return before
