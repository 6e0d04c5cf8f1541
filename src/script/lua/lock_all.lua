-- lock_all: grant several locks of one slot to one owner, every one or none, each with its
-- own fence (lock prologue and fence rule first; the prologue's `lock` state of KEYS[1] is
-- not used: every key is read here). The data model per key is the mutex's (`acquire.lua`).
--
-- KEYS[1..n] the lock keys (hashes, all in one slot, no duplicates).
-- ARGV[1] owner token, ARGV[2] TTL in ms, ARGV[3] floor: every token granted is above it
--   (decimal, 0 for none, below 2^53), ARGV[4] fence mode (as `acquire`),
--   ARGV[5] expiry grace.
--
-- Replies: {1, behind, fence_1, ..., fence_n} granted (behind: the largest µs a stored fence
-- was ahead of the clock in clock mode, else 0); {2, 0, fence_1, ..., fence_n} this owner
-- already holds every key (a resent script, no write); {0, pttl, i} key i is held by another
-- owner, whose lease ends in pttl ms (only its `waiters` flag written, as `acquire` does);
-- an error reply (no write) when a next fence would pass 2^53 - 1 or the epoch cannot be
-- read. Not allow-oom.
#!lua
local states = {}
local mine = 0
for i, key in ipairs(KEYS) do
  local state = redis.call('HMGET', key, 'owner', 'until', 'fence', 'holds', 'waiters')
  local holder, ends = state[1], tonumber(state[2])
  if holder and ends and ends > now_ms then
    if holder ~= ARGV[1] then
      if not state[5] then redis.call('HSET', key, 'waiters', 1) end
      return {0, ends - now_ms, i}
    end
    mine = mine + 1
  end
  states[i] = state
end
if mine == #KEYS then
  local reply = {2, 0}
  for i = 1, #KEYS do reply[i + 2] = tonumber(states[i][3]) end
  return reply
end
local fences, behind = {}, 0
for i = 1, #KEYS do
  local fence, ahead = next_fence(tonumber(states[i][3]) or 0, tonumber(ARGV[3]), ARGV[4])
  if not fence then return ahead end
  fences[i] = fence
  if ahead > behind then behind = ahead end
end
local ends = now_ms + tonumber(ARGV[2])
local reply = {1, behind}
for i, key in ipairs(KEYS) do
  if states[i][4] then
    -- A re-entered lock's leftover holds (a queue's places and its `waiters` mark stay).
    local gone = {'holds'}
    for _, field in ipairs(redis.call('HKEYS', key)) do
      if string.sub(field, 1, 2) == 'h:' then gone[#gone + 1] = field end
    end
    redis.call('HDEL', key, unpack(gone))
  end
  redis.call('HSET', key, 'owner', ARGV[1],
    'until', string.format('%.0f', ends),
    'fence', string.format('%.0f', fences[i]))
  keep(key, fences[i], ends)
  reply[i + 2] = fences[i]
end
return reply
