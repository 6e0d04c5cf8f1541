-- fenced_set: store a value only under a fence token no lower than any accepted before.
--
-- KEYS[1] the resource: a hash with fields `value` and `fence`.
-- ARGV[1] the writer's fence token (decimal), ARGV[2] the value.
--
-- Replies: {1, fence} written; {0, highest} rejected, with the highest fence accepted so far.
-- Not allow-oom.
#!lua
local highest = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
local fence = tonumber(ARGV[1])
if fence < highest then
  return {0, highest}
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1])
return {1, fence}
