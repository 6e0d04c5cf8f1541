-- fair_force_unlock: an operator frees a fair lock whoever holds it (lock prologue, fence
-- rule, fair snippet and the inspection snippet first). The holder goes, the fence stays, the
-- queue stays in arrival order (dead places are deleted) and the lock goes to its head as a
-- release hands it (`hand`, fair.lua: granted on the server and announced, or woken); the key's expiry covers the live places. A freed live hold leaves
-- its owner token in `forced`, as force_unlock.lua does, so the holder's next release, extend or
-- renewal answers -2 (freed by a forced unlock).
--
-- KEYS[1] the fair lock key. ARGV[1] announce (`s`, `p`, empty), ARGV[2] open TTL ms
-- (unused; a grant to the head takes the head's own TTL), ARGV[3] expiry grace.
--
-- Replies: the inspection of the state it found, before freeing it. allow-oom.
#!lua flags=allow-oom
local before = inspect('fair')
if owner then
  clear(KEYS[1], lock)
  if live then redis.call('HSET', KEYS[1], 'forced', owner) end
  local q = scan(nil)
  local latest = q.latest
  if now_ms > latest then latest = now_ms end
  hand(q, ARGV[1], lock[3], latest)
end
return before
