-- latch_state: read a latch's state (no writes).
--
-- KEYS[1] the latch key (fields: see latch_set).
--
-- Replies: {gen, count, opened}: the current generation (0 when the latch is not set: never,
-- or its open state expired), its remaining count, and the latest generation that reached
-- zero (0 for none).
#!lua flags=no-writes
local latch = redis.call('HMGET', KEYS[1], 'gen', 'count', 'opened')
return {tonumber(latch[1]) or 0, tonumber(latch[2]) or 0, tonumber(latch[3]) or 0}
