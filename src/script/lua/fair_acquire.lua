-- fair_acquire: grant the fair lock in arrival order, or keep the caller's place in the queue
-- (lock prologue, fence snippet and fair snippet first).
--
-- KEYS[1] the fair lock key (hash). ARGV[1] owner token, ARGV[2] TTL in ms, ARGV[3] floor
-- (decimal, 0 for none), ARGV[4] fence mode (as acquire), ARGV[5] place
-- lease in ms (0: do not queue, a one-shot try), ARGV[6] the most live places the queue may
-- hold (`MAX_FAIR_WAITERS`), ARGV[7] expiry grace.
--
-- Granted when the lock is free and no live place is queued, or the caller's place is the head (its
-- place is removed; the fence by acquire's rule). While a live place may be queued the state's
-- waiters mark is `q` (prologue.lua): set when a place is taken, kept by a grant that leaves
-- places behind; a free lock without it is granted at once, without reading the queue (the
-- fence rule and the queue's helpers are inlined at the `--@queue` line, for the calls that
-- meet a queue). A plain grant answers its fence alone, an integer, as acquire.lua's does. A queued caller's place carries its grant
-- arguments (`g:<owner>`, see fair.lua), so that a release may grant it the lock on the server
-- and announce the grant on its channel (`hand`); such a caller that polls instead gets {2, ...}. Dead places are deleted when seen. Otherwise the
-- caller is queued if it was not (seq = ++qseq: the arrival moment) and its place's lease is moved
-- to now + ARGV[5]. A caller without a place finding ARGV[6] live places gets none (the queue's
-- size bounds every call that reads it): it is told to try again within a third of ARGV[5].
--
-- Replies: {1, fence, behind, 0} granted; {2, fence, 0, 0} this owner holds it already (a
-- resent script, or a grant a release handed it on the server): its lease end moves to now +
-- ARGV[2], so the caller measures the lease from this call as from a grant; {0, wait ms, places ahead, queued} busy: wait ms is when the
-- answer may change without an announcement (the holder's lease end, or the head place's
-- lease end while that place is not the caller's, whichever is first), queued 1 when this
-- call created the caller's place, -1 when the queue was full (no place; places ahead is then
-- the queue's length); an error reply (no write) as acquire's. Not allow-oom.
#!lua
if not live and lock[5] ~= 'q' then
  -- No place queued (the state's waiters mark is `q` while one may be): a free lock is
  -- granted at once, as acquire.lua grants (the fence rule and the grant's expiry inlined, so
  -- this path creates no function).
  local stored, floor, mode, count = (lock[3] or 0) + 0, ARGV[3], ARGV[4], 1
  local fence, behind = stored + 1, 0
--@fence
  if not fence then return behind end
  local ends = now_ms + ARGV[2]
  redis.call('HSET', KEYS[1], 'until', string.format('%d %d %s', ends, fence, ARGV[1]))
--@expiry
  if behind == 0 then return fence end
  return {1, fence, behind, 0}
end
--@queue
if live and owner == ARGV[1] then
  local ends = now_ms + tonumber(ARGV[2])
  if ends > expires then
    lock[2] = ends
    store(KEYS[1], lock)
    raise(lock[3], ends)
  end
  return {2, tonumber(lock[3]), 0, 0}
end
local fence, behind
if not live then
  fence, behind = next_fence(tonumber(lock[3]) or 0, ARGV[3], ARGV[4])
  if not fence then return behind end
end
local me = ARGV[1]
local q = scan(me)
if not live and (not q.head or q.head == me) then
  if q.mine then redis.call('HDEL', KEYS[1], 'q:' .. me, 'g:' .. me) end
  local ends = now_ms + tonumber(ARGV[2])
  local others = q.count - (q.mine and 1 or 0)
  store(KEYS[1], {me, ends, fence, nil, others > 0 and 'q' or nil})
  local latest = q.latest
  if ends > latest then latest = ends end
  keep(KEYS[1], fence, latest)
  return {1, fence, behind, 0}
end
local wait = 0
if live then wait = expires - now_ms end
if q.head and q.head ~= me and (wait == 0 or q.head_end - now_ms < wait) then
  wait = q.head_end - now_ms
end
local place = tonumber(ARGV[5])
if place <= 0 then
  if q.mine then return {0, wait, q.ahead, 0} end
  return {0, wait, q.count, 0}
end
local queued = 0
local seq = q.mine
if not seq then
  if q.count >= tonumber(ARGV[6]) then
    local poll = math.max(1, math.floor(place / 3))
    if wait > poll then wait = poll end
    return {0, wait, q.count, -1}
  end
  seq = redis.call('HINCRBY', KEYS[1], 'qseq', 1)
  queued = 1
  q.ahead = q.count
end
local ends = now_ms + place
redis.call('HSET', KEYS[1], 'q:' .. me, string.format('%d %d', seq, ends),
  'g:' .. me, ARGV[2] .. ' ' .. ARGV[5] .. ' ' .. ARGV[3] .. ' ' .. ARGV[4])
if lock[5] ~= 'q' then
  lock[5] = 'q'
  store(KEYS[1], lock)
end
local latest = q.latest
if ends > latest then latest = ends end
if live and expires > latest then latest = expires end
keep(KEYS[1], lock[3], latest)
return {0, wait, q.ahead, queued}
