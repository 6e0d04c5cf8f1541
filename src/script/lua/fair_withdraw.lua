-- fair_withdraw: a waiting call that ends without the lock (dropped, timed out, failed) gives
-- up its place at once, and whatever its last request may have been granted (lock prologue,
-- fence snippet and fair snippet first).
--
-- KEYS[1] fair lock key. ARGV[1] owner token, ARGV[2] announce (`s`, `p` or empty, as
-- fair_release), ARGV[3] expiry grace.
--
-- Deletes `q:<owner>` (with its grant arguments and its arrival index entry, mutex_queue.lua);
-- if this owner holds the lock (a grant whose reply was never read), frees
-- it too. When that freed the lock or removed the head's place, the lock goes to the new head
-- as a release hands it (`hand`, fair.lua: granted on the server, or woken); a freed lock with
-- no place left is announced on the lock's channel when an acquire marked it busy.
--
-- Replies: 1 something was removed; 0 nothing of this owner was there (a resent call).
-- allow-oom.
#!lua flags=allow-oom
local me = ARGV[1]
local before = scan(me)
local was_head = before.mine and before.ahead == 0
if before.mine then redis.call('HDEL', KEYS[1], 'q:' .. me, 'g:' .. me, 's:' .. before.mine) end
local freed = owner == me
if freed then clear(KEYS[1], lock) end
if not before.mine and not freed then return 0 end
local q = scan(me)
local latest = now_ms
if q.latest > latest then latest = q.latest end
if live and not freed and expires > latest then latest = expires end
if q.head and (freed or (was_head and not live)) then
  hand(q, ARGV[2], lock[3], latest)
else
  keep(KEYS[1], lock[3], latest)
  -- A freed grant with no place left to hand it to: callers waiting without a place (marked
  -- by an acquire that found it busy) are told, as by a release.
  if freed and live and lock[5] then
    if ARGV[2] == 's' then redis.call('SPUBLISH', KEYS[1], '')
    elseif ARGV[2] == 'p' then redis.call('PUBLISH', KEYS[1], '') end
  end
end
return 1
