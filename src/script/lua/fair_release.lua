-- fair_release: free the fair lock held by this owner and hand it to the head of the queue
-- (lock prologue first; a call that meets a queue runs keep.lua, raise.lua, fair.lua and
-- mutex_queue.lua, inlined at its `--@queue` line).
--
-- KEYS[1] fair lock key. ARGV[1] owner token, ARGV[2] hold id (always empty: no re-entry),
-- ARGV[3] announce: `s` SPUBLISH, `p` PUBLISH, empty for none, ARGV[4] expiry grace.
--
-- Without the state's waiters mark `q` no place is queued (fair_acquire.lua): the state keeps
-- the fence only and the key its expiry, nothing is read or announced, and no function is
-- created. Otherwise the head, found through the arrival index (mutex_queue.lua's `head`, as
-- the mutex's release finds it), is granted the lock here and told so on its client's channel
-- `<key>:w:<client>` (`hand_head`), or, when its place does not qualify, only woken there; no
-- other waiter hears of the release.
--
-- Replies: 1 released; 0 no live lease (expired; this owner's leftovers are cleared and the
-- head is woken all the same); -1 held by another owner (left alone); -2 this owner's hold was
-- freed by a forced unlock (`forced`, see fair_force_unlock.lua). allow-oom.
#!lua flags=allow-oom
if owner ~= ARGV[1] then
  if redis.call('HGET', KEYS[1], 'forced') == ARGV[1] then return -2 end
  if live then return -1 end
  return 0
end
if lock[5] ~= 'q' then
  -- No place queued (fair_acquire.lua): freed, nothing to hand on; the expiry the grant set
  -- already covers the fence.
  redis.call('HSET', KEYS[1], 'until', '0 ' .. lock[3] .. ' ')
  if live then return 1 end
  return 0
end
--@queue
if lock[4] then clear(KEYS[1], lock) end
hand_head(ARGV[3], lock[3])
if live then return 1 end
return 0
