-- latch_count_down: count one id down in a latch's generation; the count-down that reaches
-- zero opens the generation and announces it (lock prologue first).
--
-- KEYS[1] the latch key (fields: see latch_set). ARGV[1] the id counting down (non-empty),
-- ARGV[2] the generation it counts in (decimal), or empty for the current one, ARGV[3]
-- announce: `s` SPUBLISH, `p` PUBLISH, empty for none (the channel is the latch key), ARGV[4]
-- open TTL in ms, ARGV[5] expiry grace.
--
-- An id counts once per generation (`d:<id>`): the same id again, or a resent script, changes
-- nothing and answers the same remaining count. Reaching zero sets `opened` to the generation,
-- drops the ids, sets the key to expire at max(now + open TTL, generation as ms) + grace (clock
-- mode; kept in counter and epoch modes) and publishes the generation.
--
-- Replies: {1, gen, remaining} counted, or counted before, or the generation is open already
-- (remaining 0); {0, 0, 0} the latch is not set (never, or its open state expired); {-1, gen,
-- 0} ARGV[2] is not the current generation `gen` (a stale round: nothing counted). Not
-- allow-oom (it adds a field).
#!lua
local latch = redis.call('HMGET', KEYS[1], 'gen', 'count')
local gen = tonumber(latch[1])
if not gen then return {0, 0, 0} end
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= gen then return {-1, gen, 0} end
local count = tonumber(latch[2])
if count == 0 then return {1, gen, 0} end
if redis.call('HSETNX', KEYS[1], 'd:' .. ARGV[1], '1') == 0 then return {1, gen, count} end
count = count - 1
redis.call('HSET', KEYS[1], 'count', string.format('%.0f', count))
if count > 0 then return {1, gen, count} end
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, 2) == 'd:' then redis.call('HDEL', KEYS[1], field) end
end
redis.call('HSET', KEYS[1], 'opened', latch[1])
keep(KEYS[1], gen, now_ms + tonumber(ARGV[4]))
if ARGV[3] == 's' then redis.call('SPUBLISH', KEYS[1], latch[1])
elseif ARGV[3] == 'p' then redis.call('PUBLISH', KEYS[1], latch[1]) end
return {1, gen, 0}
