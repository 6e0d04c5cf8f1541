-- latch_count_down: count one id down in a latch's generation; the count-down that reaches
-- zero opens the generation and announces it. Standalone (no lock prologue): a count-down
-- that does not open reads no time, and costs one HMGET, one HSETNX and one HINCRBY.
--
-- KEYS[1] the latch key (fields: see latch_set). ARGV[1] the id counting down (non-empty),
-- ARGV[2] the generation it counts in (decimal), or empty for the current one, ARGV[3]
-- announce: `s` SPUBLISH, `p` PUBLISH, empty for none (the channel is the latch key), ARGV[4]
-- open TTL in ms, ARGV[5] expiry grace.
--
-- An id counts once per generation (`d:<id>`): the same id again, or a resent script, changes
-- nothing and answers the same remaining count. Reaching zero rewrites the hash without the ids
-- (`DEL`, then one `HSET` of `fence`, `gen`, `count` 0, `set` and `opened` = the generation:
-- the fields latch_set writes, so the layout is the one every client version reads), sets the
-- key to expire at max(now + open TTL, the generation as server time, `fm`) + grace (so that a
-- clock-mode generation is never granted again after the key expired, even when it was ahead
-- of the clock; kept for good without a grace, i.e. in counter and epoch modes) and publishes
-- the generation. Numbers pass to commands exactly (below 2^53).
--
-- Replies: {1, gen, remaining} counted, or counted before, or the generation is open already
-- (remaining 0); {0, 0, 0} the latch is not set (never, or its open state expired); {-1, gen,
-- 0} ARGV[2] is not the current generation `gen` (a stale round: nothing counted). Not
-- allow-oom (it adds a field).
#!lua
local latch = redis.call('HMGET', KEYS[1], 'gen', 'count', 'fence', 'set')
local gen = tonumber(latch[1])
if not gen then return {0, 0, 0} end
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= gen then return {-1, gen, 0} end
local count = tonumber(latch[2])
if count == 0 then return {1, gen, 0} end
if redis.call('HSETNX', KEYS[1], 'd:' .. ARGV[1], '1') == 0 then return {1, gen, count} end
count = redis.call('HINCRBY', KEYS[1], 'count', -1)
if count > 0 then return {1, gen, count} end
-- Read on the opening path only: the count-downs before it read no more than they did.
local generation_ms = tonumber(redis.call('HGET', KEYS[1], 'fm'))
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'fence', latch[3] or latch[1], 'gen', latch[1], 'count', '0',
  'set', latch[4] or '', 'opened', latch[1])
local grace = tonumber(ARGV[5])
if grace then
  local now = redis.call('TIME')
  local ends = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(ARGV[4])
  if generation_ms and generation_ms > ends then ends = generation_ms end
  redis.call('PEXPIREAT', KEYS[1], string.format('%d', ends + grace))
end
if ARGV[3] == 's' then redis.call('SPUBLISH', KEYS[1], latch[1])
elseif ARGV[3] == 'p' then redis.call('PUBLISH', KEYS[1], latch[1]) end
return {1, gen, 0}
