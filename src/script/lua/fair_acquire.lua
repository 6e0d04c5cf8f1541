-- fair_acquire: grant the fair lock in arrival order, or keep the caller's place in the queue
-- (lock prologue and the fence rule first; a call that meets a queue runs keep.lua, raise.lua,
-- fair.lua and mutex_queue.lua, inlined at its `--@queue` line).
--
-- KEYS[1] the fair lock key (hash). ARGV[1] owner token, ARGV[2] TTL in ms, ARGV[3] floor
-- (decimal, 0 for none), ARGV[4] fence mode (as acquire), ARGV[5] place
-- lease in ms (0: do not queue, a one-shot try), ARGV[6] the most places the queue may
-- hold (`MAX_FAIR_WAITERS`), ARGV[7] expiry grace.
--
-- Granted when the lock is free and no live place is queued, or the caller's place is the head
-- (its place is removed; the fence by acquire's rule). While a live place may be queued the
-- state's waiters mark is `q` (prologue.lua): set when a place is taken, kept by a grant that
-- leaves places behind; a free lock without it is granted at once, without reading the queue.
-- The queue is the mutex's (acquire.lua): places `q:<owner>` = "<seq> <place lease end ms>"
-- with their grant arguments `g:<owner>` (fair.lua), and the arrival index `s:<seq>` / `qh`, so
-- the head is found without reading the whole queue (mutex_queue.lua's `head`, which deletes
-- the dead places it walks over; at most 64 index entries a call: a free lock whose first 64
-- entries are all gone is not granted: the caller is told to try again in 1 ms, and that call
-- walks on; a call that finds the lock held walks only while the index spans more than 64
-- entries: the holder's release walks up to 64 and so reaches the head, which matters to no one
-- before then). A queued caller's place carries its grant
-- arguments, so that a release may grant it the lock on the server and announce the grant on
-- its channel (`hand_head`); such a caller that polls instead gets {2, ...}. Otherwise the
-- caller is queued if it was not (seq = qseq + 1, its arrival, written with its index entry and
-- `qseq`; a `qseq` that is not a number counts as 0) and its
-- place's lease is moved to now + ARGV[5]. The queue's length is read from the hash's field
-- count (three fields a place; a place whose lease ended counts until a walk or a scan deletes
-- it): a caller without a place finding ARGV[6] places gets none (the queue's size bounds the
-- calls that read it) and is told to try again within a third of ARGV[5].
--
-- Replies: {1, fence, behind, 0} granted (a plain grant answers its fence alone, an integer, as
-- acquire.lua's does); {2, fence, 0, 0} this owner holds it already (a resent script, or a grant
-- a release handed it on the server): its lease end moves to now + ARGV[2], so the caller
-- measures the lease from this call as from a grant; {0, wait ms, places ahead, queued} busy:
-- wait ms is when the answer may change without an announcement (the holder's lease end, or,
-- when the call walked, the head place's lease end while that place is not the caller's,
-- whichever is first), places ahead by the index (arrivals from the head's to the caller's,
-- withdrawn ones included; from `qh` when a held lock's queue was not walked; the queue's
-- length for a caller without a place), queued 1 when this call created the caller's
-- place, -1 when the queue was full (no place); an error reply as acquire's (its only writes
-- before it are the walk's deletions of places that are gone). Not allow-oom.
#!lua
if not live and lock[5] ~= 'q' then
  -- No place queued (the state's waiters mark is `q` while one may be): a free lock is
  -- granted at once, as acquire.lua grants (the fence rule and the grant's expiry inlined, so
  -- this path creates no function).
  local stored, floor, mode, count, key = (lock[3] or 0) + 0, ARGV[3], ARGV[4], 1, KEYS[1]
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
local me = ARGV[1]
local q, pending, last, walked, mine
if live then
  local at = redis.call('HMGET', KEYS[1], 'qh', 'qseq', 'q:' .. me)
  walked, last, mine = tonumber(at[1]) or 1, tonumber(at[2]) or 0, at[3] or nil
end
if not live or last - walked >= 64 then
  -- A held lock's queue is walked only when its index spans more than the 64 entries the
  -- holder's release walks, so that the release reaches the head.
  q, pending, last, walked, mine = head(me)
end
if not live and ((q and q.head == me) or (not q and not pending)) then
  -- The head (this caller), or no place is queued: granted.
  local fence, behind = next_fence(tonumber(lock[3]) or 0, ARGV[3], ARGV[4], nil, KEYS[1])
  if not fence then return behind end
  take(q, pending, last, me, fence, tonumber(ARGV[2]))
  return {1, fence, behind, 0}
end
-- Busy. Places ahead by the arrival index, from the head on; the queue's length by the fields
-- (each place has three: `q:`, `g:` and `s:`; `until`, `qseq`, `qh` and `forced` round away),
-- so that a withdrawn place stops counting at once.
local first = q and q.seq or walked
local wait, latest = 0, 0
if live then wait, latest = expires - now_ms, expires end
if q and q.head ~= me and (wait == 0 or q.head_end - now_ms < wait) then
  wait = q.head_end - now_ms
elseif not live and not q then
  -- The walk stopped after 64 entries of places gone: the next call goes on from there.
  wait = 1
end
local place = tonumber(ARGV[5])
local seq = mine and tonumber(string.match(mine, '^(%d+) '))
local count
if not seq then count = math.max(0, math.floor((redis.call('HLEN', KEYS[1]) - 2) / 3)) end
if place <= 0 then
  if seq then return {0, wait, math.max(0, seq - first), 0} end
  return {0, wait, count, 0}
end
local queued = 0
if not seq then
  if count >= tonumber(ARGV[6]) then
    local poll = math.max(1, math.floor(place / 3))
    if wait > poll then wait = poll end
    return {0, wait, count, -1}
  end
  seq = last + 1
  queued = 1
end
hold_place(me, string.format('%d', seq), queued == 1, now_ms + place, latest)
return {0, wait, math.max(0, seq - first), queued}
