-- acquire: grant the lock to an owner and advance its fence, or keep a waiting caller's place in
-- the lock's queue (lock prologue first; the fence rule, fence.lua, inlined at its `--@fence`
-- line; a call that meets a queue, or keeps a place, runs keep.lua, raise.lua, fair.lua and
-- mutex_queue.lua, inlined at its `--@queue` line; an uncontended grant inlines keep.lua's
-- rule too, and so creates no function at all).
--
-- `acquire_floor` is this script with the floor read of `floor_read.lua` in its fence rule (a
-- lock without a key, in a clock mode, takes the floor key of a module that deletes released
-- locks' keys as its last fence): the same KEYS, ARGV and replies.
--
-- KEYS[1] the lock key (hash).
-- ARGV[1] owner token, ARGV[2] TTL in ms, ARGV[3] floor: the token granted is above it
--   (decimal, 0 for none, below 2^53), ARGV[4] fence mode: `clock` (raise the floor to TIME in
--   µs), `epoch` (to cluster_my_epoch × 2^32, cluster only), `hybrid` (both, cluster only) or
--   `counter` (a plain counter), see fence.lua; then, for a caller that waits across processes
--   (issue 25), ARGV[5] its place lease in ms (absent or 0: no place, a one-shot try or a wait
--   without one); the last ARGV the expiry grace (see prologue.lua).
--
-- The queue: a caller with a place lease that finds the lock busy (held, or free with a live
-- place ahead of it) keeps a place `q:<owner>` = "<seq> <place lease end>" with its grant
-- arguments `g:<owner>` = "<TTL> <place lease> <floor> <mode>" (the fair lock's layout, fair.lua;
-- seq = ++`qseq`, kept across its attempts), and `waiters` is set to `q`. While `waiters` is `q`
-- a free lock goes to the head place (the live place with the lowest seq) only: a caller that is
-- not the head gets busy (no barging ahead of the queue); a release grants the lock to the head
-- on the server and announces it on the head's client's channel (release.lua, `hand`). Dead
-- places go when a scan sees them; the watchdog renews live ones (fair_renew_place.lua); a caller
-- that gives up withdraws its place (fair_withdraw.lua). The head is found through the arrival
-- index `s:<seq>` / `qh` (mutex_queue.lua, `head`), not by reading the whole queue. A caller
-- finding the hash at 400 fields or more (about 128 places with their index entries, and the
-- lock's own) gets no place and polls. A free lock whose first 64 index entries are all gone is
-- granted to the caller (the walk stops there; the next call goes on from where it stopped). A
-- caller granted a free lock outside the queue while a mark other than `q` is set (an older
-- client's busy attempt overwrote it) loses the place it kept, so no release grants it later.
--
-- Replies: fence (an integer: cheaper for the server to send than an array) or, when the stored
-- fence was ahead of the clock, {1, fence, behind} granted (behind: µs the stored fence was
-- ahead of the clock in clock mode; a grant to the head of a queue answers {1, fence, 0}); {2, fence, 0} this owner already holds it (a resent script, or a grant a
-- release made to its place on the server: the lease end moves to now + TTL, so the caller may
-- measure its lease from this call); {0, wait ms, 0} or, for a caller with a place lease,
-- {0, wait ms, 0, queued} (queued: 1 this call created its place, 0 it had one, -1 the queue
-- was full: no place) busy: held by another owner (wait: its
-- lease left; `waiters` set, so the release announces: to the first 8 characters of the owner
-- token, which name the client, `*` once several clients wait, or `q` with a queue), or free
-- with a live place ahead (wait: the head place's lease left), or yielded by this client to
-- another one for pttl ms more (see handoff.lua); an error reply (no write) when the next fence
-- would pass 2^53 - 1 or the epoch cannot be read. Not allow-oom: refused with OOM at maxmemory.
#!lua
local place = 0
if #ARGV >= 6 then place = tonumber(ARGV[5]) or 0 end
if (live and (owner == ARGV[1] or place > 0)) or (not live and lock[5] == 'q') then
--@queue
  local me = ARGV[1]
  if live and owner == me then
    local ends = now_ms + tonumber(ARGV[2])
    if ends > expires then
      lock[2] = ends
      store(KEYS[1], lock)
      raise(lock[3], ends)
    end
    return {2, tonumber(lock[3]), 0}
  end
  local wait, latest, mine, last
  if live then
    wait, latest = expires - now_ms, expires
    local at = redis.call('HMGET', KEYS[1], 'qseq', 'q:' .. me)
    last, mine = tonumber(at[1]) or 0, at[2] or nil
  else
    local q, pending, _
    q, pending, last, _, mine = head(me)
    if q and q.head ~= me then
      if place <= 0 then return {0, q.head_end - now_ms, 0} end
      wait, latest = q.head_end - now_ms, q.head_end
    else
      -- The head (this caller), or no live place is queued: granted.
      local fence, behind = next_fence(tonumber(lock[3]) or 0, tonumber(ARGV[3]), ARGV[4], nil, KEYS[1])
      if not fence then return behind end
      if lock[4] then clear(KEYS[1], lock) end
      take(q, pending, last, me, fence, tonumber(ARGV[2]))
      return {1, fence, behind}
    end
  end
  local seq, queued = nil, 0
  if mine then
    seq = string.match(mine, '^(%d+) ')
  elseif redis.call('HLEN', KEYS[1]) >= 400 then
    return {0, wait, 0, -1}
  else
    seq, queued = string.format('%d', last + 1), 1
  end
  hold_place(me, seq, queued == 1, now_ms + place, latest)
  return {0, wait, 0, queued}
end
local w = lock[5]
if live then
  local tag = string.sub(ARGV[1], 1, 8)
  local mark
  if not w then mark = tag
  elseif w ~= '*' and w ~= 'q' and w ~= tag and w ~= 'y' .. tag then mark = '*' end
  if mark then
    redis.call('HSET', KEYS[1], 'until', lock[2] .. ' ' .. lock[3] .. ' ' .. owner
      .. (lock[4] and ' h' .. lock[4] or '') .. ' w' .. mark)
  end
  return {0, expires - now_ms, 0}
end
if w and w == 'y' .. string.sub(ARGV[1], 1, 8) then
  if expires and expires > now_ms then return {0, expires - now_ms, 0} end
  w = nil
end
-- fence.lua's rule, inlined (see its `--@fence` lines).
local stored, floor, mode, count, key = (lock[3] or 0) + 0, ARGV[3], ARGV[4], 1, KEYS[1]
local fence, behind = stored + 1, 0
--@fence
if not fence then return behind end
if lock[4] then
  -- keep.lua's `clear` of a re-entered lock's leftovers, inlined (clear_holds.lua).
--@clear
end
if place > 0 and lock[5] then
  -- A mark other than the queue's (an older client's busy attempt overwrote `q`): a place this
  -- caller kept from an earlier attempt goes with its grant, so no later release grants it.
  redis.call('HDEL', KEYS[1], 'q:' .. ARGV[1], 'g:' .. ARGV[1])
end
local ends = now_ms + ARGV[2]
if w then
  redis.call('HSET', KEYS[1], 'until', string.format('%d %d %s w%s', ends, fence, ARGV[1], w))
else
  redis.call('HSET', KEYS[1], 'until', string.format('%d %d %s', ends, fence, ARGV[1]))
end
-- The grant's expiry (grant_expiry.lua, keep.lua's rule), inlined.
--@expiry
if behind == 0 then return fence end
return {1, fence, behind}
