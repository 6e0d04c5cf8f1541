-- latch_set: start a new generation (round) of a countdown latch (own prologue, fence rule and
-- own_keep.lua first).
--
-- KEYS[1] the latch key (hash): `fence` the last generation granted (never removed), `gen` the
-- current generation, `count` its remaining count, `set` the id of the set call that started
-- it, `opened` the latest generation that reached zero, `d:<id>` the ids counted down in `gen`
-- (dropped once it opens), `fm` an armed generation read as server time in ms (clock and
-- hybrid modes: the opening keeps the key at least until then).
-- ARGV[1] count (decimal, 0 to 2^53 - 1; 0 opens at once), ARGV[2] the call's set id (random,
--   so a resent script starts no second generation), ARGV[3] floor: the generation is above it
--   (decimal, 0 for none, below 2^53), ARGV[4] `clock`, `hybrid`, `epoch` or `counter` (the
--   fence rule), ARGV[5] announce an opening: `s` SPUBLISH, `p` PUBLISH, empty for none (the
--   channel is the latch key), ARGV[6] open TTL in ms, ARGV[7] expiry grace.
--
-- The new generation is the next fence (fence rule: above every earlier generation, also after
-- a failover lost writes or the key expired, in clock mode). The ids of the previous round are
-- dropped; `opened` is kept, so waiters of a round that opened still see it. An armed latch is
-- kept without expiry; an open one expires at max(now + open TTL, generation as ms) + grace in
-- clock mode, and is kept in counter and epoch modes.
--
-- Replies: {1, gen, behind} started (behind: µs the stored fence was ahead of the clock, clock
-- mode); {2, gen, 0} this set call already started the current generation (a resent script:
-- no write); an error reply (no write) past 2^53 - 1. Not allow-oom.
#!lua
local latch = redis.call('HMGET', KEYS[1], 'gen', 'set', 'opened', 'fence')
if latch[1] and latch[2] == ARGV[2] then return {2, tonumber(latch[1]), 0} end
local fence, behind = next_fence(tonumber(latch[4]) or 0, ARGV[3], ARGV[4], nil, KEYS[1])
if not fence then return behind end
local gen = string.format('%.0f', fence)
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'fence', gen, 'gen', gen, 'count', ARGV[1], 'set', ARGV[2])
if latch[3] then redis.call('HSET', KEYS[1], 'opened', latch[3]) end
if tonumber(ARGV[1]) > 0 then
  if memo.shift then
    -- The generation read as server time: the opening keeps the key until then (plus the
    -- grace), as a grant's expiry would have.
    redis.call('HSET', KEYS[1], 'fm', string.format('%d', math.ceil((fence - memo.shift) / 1000)))
  end
  redis.call('PERSIST', KEYS[1])
  return {1, fence, behind}
end
redis.call('HSET', KEYS[1], 'opened', gen)
keep(KEYS[1], fence, now_ms + tonumber(ARGV[6]))
if ARGV[5] == 's' then redis.call('SPUBLISH', KEYS[1], gen)
elseif ARGV[5] == 'p' then redis.call('PUBLISH', KEYS[1], gen) end
return {1, fence, behind}
