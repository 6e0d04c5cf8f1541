-- fenced_set: store a value only under a fence token no lower than any accepted before.
--
-- KEYS[1] the resource: a hash with fields `value` and `fence`.
-- ARGV[1] the writer's fence token (decimal), ARGV[2] the value.
--
-- Replies: {1, fence} written; {0, highest} rejected, with the highest fence accepted so far;
-- an error reply (no write) when the stored `fence` is not a token (digits, below 2^53: another
-- program wrote it), which no comparison could judge. Not allow-oom.
#!lua
local stored = redis.call('HGET', KEYS[1], 'fence') or '0'
local highest = string.match(stored, '^%d+$') and #stored <= 16 and tonumber(stored)
if not highest or highest > 9007199254740991 then
  return redis.error_reply('ERR fencelock: the field fence of ' .. KEYS[1] .. ' holds ' .. string.format('%q', string.sub(stored, 1, 40)) .. ', not a fence token: another program wrote it; delete the field (or the key) once you know which writes it should admit')
end
local fence = tonumber(ARGV[1])
if fence < highest then
  return {0, highest}
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1])
return {1, fence}
