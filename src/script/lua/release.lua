-- release: end one hold of this owner; the last frees the lock (keeping the fence: keep.lua's
-- `clear`, inlined) and, when an acquire found it busy meanwhile (`waiters`), announces it on
-- the lock's channel (lock prologue first; a call that meets a queue runs the fence rule,
-- keep.lua, raise.lua and the queue snippet fair.lua, inlined at its `--@queue` line). With a
-- queue (`waiters` is `q`, see acquire.lua) it grants the lock to the head place instead, on the server, and
-- announces the grant on the head's client's channel only (`hand`, fair.lua: the fence by the
-- head's own arguments, its TTL from now); a head whose place was not renewed lately is only
-- woken there. Without waiters nothing is published: in a cluster every SPUBLISH is also sent
-- to the shard's replicas.
--
-- KEYS[1] lock key. ARGV[1] owner token, ARGV[2] hold id (empty for the hold the acquire
-- granted), ARGV[3] announce: `s` SPUBLISH, `p` PUBLISH, empty for none (the channel is the
-- lock key); ARGV[4] expiry grace (a release that only frees leaves the key's expiry as the
-- grant or the last extension set it, lease end or fence plus the grace, which already covers
-- what the key must outlive; a handoff to a queued place sets it as a grant does).
--
-- Replies: 1 released (or one hold of several; a hold released twice answers 1 both times and
-- counts once; a hold never added, a re-entry cut before it reached Redis, answers 1 and
-- changes nothing); 0 no live lease (expired; this owner's leftovers are cleared, and a queue's
-- head is handed the lock as by a release in time); -1 held by
-- another owner (left alone); -2 (before -1/0) this owner's hold was freed by a forced unlock
-- (`forced`, see force_unlock.lua). allow-oom: it only removes fields (or hands the lock to a
-- queued place, which adds none), so it runs at maxmemory too.
#!lua flags=allow-oom
if owner ~= ARGV[1] then
  if redis.call('HGET', KEYS[1], 'forced') == ARGV[1] then return -2 end
  if live then return -1 end
  return 0
end
local code = 1
if not live then
  code = 0
elseif lock[4] or ARGV[2] ~= '' then
  if redis.call('HDEL', KEYS[1], 'h:' .. ARGV[2]) == 0 then return 1 end
  local holds = (lock[4] or 1) - 1
  if holds > 0 then
    redis.call('HSET', KEYS[1], 'until', lock[2] .. ' ' .. lock[3] .. ' ' .. owner .. ' h' .. holds
      .. (lock[5] and ' w' .. lock[5] or ''))
    return 1
  end
end
-- keep.lua's `clear`, inlined (this script defines no function on its common path).
if lock[4] then
--@clear
end
if lock[5] == 'q' then
--@queue
  -- hand_head writes the freed state (granted to the head, or free) itself: one write. A hold
  -- whose lease ended (code 0) hands on too: its release must not drop the queue's mark.
  if hand_head(ARGV[3], lock[3]) or code == 0 then return code end
else
  redis.call('HSET', KEYS[1], 'until', '0 ' .. lock[3] .. ' ')
  if code == 0 or not lock[5] then return code end
end
if ARGV[3] == 's' then redis.call('SPUBLISH', KEYS[1], '')
elseif ARGV[3] == 'p' then redis.call('PUBLISH', KEYS[1], '') end
return 1
