-- extend: move this owner's lease end to now + TTL (lock prologue and keep.lua first). While the lock has
-- several holds (re-entry) the lease ends at the latest end any hold asked for: an extension
-- never shortens it then, so no hold's guard overstates its validity.
--
-- KEYS[1] lock key. ARGV[1] owner token, ARGV[2] new TTL in ms, ARGV[3] expiry grace.
--
-- Replies: {1, remaining lease ms} extended; {0, 0} no live lease (expired); {-1, 0} held by
-- another owner (left alone); {-2, 0} this owner's hold was freed by a forced unlock (`forced`,
-- see force_unlock.lua). allow-oom: it rewrites one existing field (the state), so a held lock can be kept
-- (and then released) at maxmemory.
#!lua flags=allow-oom
if not live or owner ~= ARGV[1] then
  if redis.call('HGET', KEYS[1], 'forced') == ARGV[1] then return {-2, 0} end
  if not live then return {0, 0} end
  return {-1, 0}
end
local ends = now_ms + ARGV[2]
if (lock[4] or 1) + 0 > 1 and expires > ends then ends = expires end
lock[2] = ends
store(KEYS[1], lock)
keep(KEYS[1], lock[3], ends)
return {1, ends - now_ms}
