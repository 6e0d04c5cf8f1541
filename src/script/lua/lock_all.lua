-- lock_all: grant several locks of one slot to one owner, every one or none, each with its
-- own fence (lock prologue and fence rule first; the prologue's `lock` state of KEYS[1] is
-- not used: every key is read here). The data model per key is the mutex's (`acquire.lua`,
-- key layout 2: prologue.lua; a key of layout 1 other than KEYS[1], which the prologue
-- converts, gets an error reply, no write).
--
-- `lock_all_floor` is this script with the floor read of `floor_read.lua` in its fence rule (a
-- key without a fence, in a clock mode, takes the floor key of a module that deletes released
-- locks' keys as its last fence): the same KEYS, ARGV and replies.
--
-- KEYS[1..n] the lock keys (hashes, all in one slot, no duplicates).
-- ARGV[1] owner token, ARGV[2] TTL in ms, ARGV[3] floor: every token granted is above it
--   (decimal, 0 for none, below 2^53), ARGV[4] fence mode (as `acquire`),
--   ARGV[5] expiry grace.
--
-- Replies: {1, behind, fence_1, ..., fence_n} granted (behind: the largest µs a stored fence
-- was ahead of the clock in clock mode, else 0); {2, 0, fence_1, ..., fence_n} this owner
-- already holds every key (a resent script, no write); {0, pttl, i} key i is held by another
-- owner, whose lease ends in pttl ms (only its `waiters` flag written, as `acquire` does), or
-- is free with a live place of the mutex's queue (`waiters` `q`, acquire.lua): pttl is then
-- the head place's lease left (the caller keeps no place: a lock marked `q` goes to the
-- queue's head, as for an acquire without a place lease); the index entries of gone places
-- that the walk to the head met are deleted (mutex_queue.lua's `head`, inlined at the
-- `--@queue` line with fair.lua). With no live place among the 64 entries walked the key is
-- granted, `q` kept only while entries remain, and its expiry only raised while `q` stays;
-- an error reply (no write) when a next fence would pass 2^53 - 1 or the epoch cannot be
-- read. Not allow-oom.
#!lua
local states = {}
local mine = 0
for i, key in ipairs(KEYS) do
  local raw = redis.call('HGET', key, 'until')
  local ends, fence, holder, marks
  if raw then
    ends, fence, holder, marks = string.match(raw, '^(%d+) (%d+) (%S*)(.*)$')
    if not ends then return redis.error_reply('ERR fencelock: ' .. key .. ' is a key of layout 1 (fields owner/until/fence): lock it on its own first, or see "Key layout" in docs/design.md') end
  elseif redis.call('HEXISTS', key, 'fence') == 1 then
    return redis.error_reply('ERR fencelock: ' .. key .. ' is a key of layout 1 (fields owner/until/fence): lock it on its own first, or see "Key layout" in docs/design.md')
  end
  local state = {holder ~= '' and holder or nil, ends, fence or '0', nil, nil}
  if marks and marks ~= '' then
    state[4] = string.match(marks, ' h(%d+)')
    state[5] = string.match(marks, ' w(%S+)')
  end
  ends = tonumber(ends)
  if state[1] and ends > now_ms then
    if state[1] ~= ARGV[1] then
      if not state[5] then
        state[5] = '1'
        store(key, state)
      end
      return {0, ends - now_ms, i}
    end
    mine = mine + 1
  elseif state[5] == 'q' then
    -- A free lock with the mutex's queue (acquire.lua): it goes to the queue's head only, and
    -- this caller keeps no place, so a live place is a busy answer, as for an acquire without a
    -- place (mutex_queue.lua's `head`: at most 64 index entries, those of gone places deleted).
--@queue
    local q, pending = head(nil, false, key)
    if q then return {0, q.head_end - now_ms, i} end
    if not pending then state[5] = nil end
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
  local fence, ahead = next_fence(tonumber(states[i][3]) or 0, tonumber(ARGV[3]), ARGV[4], nil, KEYS[i])
  if not fence then return ahead end
  fences[i] = fence
  if ahead > behind then behind = ahead end
end
local ends = now_ms + tonumber(ARGV[2])
local reply = {1, behind}
for i, key in ipairs(KEYS) do
  if states[i][4] then
    -- A re-entered lock's leftover holds (a queue's places and its waiters mark stay).
    local gone = {}
    for _, field in ipairs(redis.call('HKEYS', key)) do
      if string.sub(field, 1, 2) == 'h:' then gone[#gone + 1] = field end
    end
    if #gone > 0 then redis.call('HDEL', key, unpack(gone)) end
  end
  store(key, {ARGV[1], ends, fences[i], nil, states[i][5]})
  if states[i][5] == 'q' then
    -- Places may wait past the walk (or behind this owner's own live hold): the expiry must
    -- still cover their leases, so it is only raised.
    raise(fences[i], ends, key)
  else
    keep(key, fences[i], ends)
  end
  reply[i + 2] = fences[i]
end
return reply