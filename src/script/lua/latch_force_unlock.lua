-- latch_force_unlock: an operator opens an armed latch (own prologue, own_keep.lua and the inspection
-- snippet first): its current generation's count becomes 0 and `opened` the generation, the
-- ids are dropped, the key expires as an opened latch's does, and the generation is published
-- on the latch's channel, so its waiters return. A latch that is open or not set is left alone.
--
-- KEYS[1] the latch key. ARGV[1] announce (`s`, `p`, empty), ARGV[2] open TTL ms, ARGV[3]
-- expiry grace.
--
-- Replies: the inspection of the state it found, before opening it. allow-oom (it drops the
-- ids; at most the field `opened` is added).
#!lua flags=allow-oom
local before = inspect('latch')
if before[2] == 1 then
  local at = redis.call('HMGET', KEYS[1], 'gen', 'fm')
  local gen, ends = at[1], now_ms + tonumber(ARGV[2])
  -- The ids go in HDELs of 512 (the operators' ACL has no DEL; one HDEL per id took 1.05 s
  -- for 300,000 of them).
  local ids = {}
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, 2) == 'd:' then ids[#ids + 1] = field end
  end
  for n = 1, #ids, 512 do
    redis.call('HDEL', KEYS[1], unpack(ids, n, math.min(n + 511, #ids)))
  end
  redis.call('HSET', KEYS[1], 'count', '0', 'opened', gen)
  -- Kept at least until the generation's own time (`fm`), as latch_count_down keeps it.
  if (tonumber(at[2]) or 0) > ends then ends = tonumber(at[2]) end
  keep(KEYS[1], gen, ends)
  if ARGV[1] == 's' then redis.call('SPUBLISH', KEYS[1], gen)
  elseif ARGV[1] == 'p' then redis.call('PUBLISH', KEYS[1], gen) end
end
return before
