-- acquire: grant the lock to an owner and advance its fence (lock prologue and fence rule
-- first).
--
-- KEYS[1] the lock key (hash).
-- ARGV[1] owner token, ARGV[2] TTL in ms, ARGV[3] floor: the token granted is above it
--   (decimal, 0 for none, below 2^53), ARGV[4] fence mode: `clock` (raise the floor to TIME in
--   µs), `epoch` (to cluster_my_epoch × 2^32, cluster only), `hybrid` (both, cluster only) or
--   `counter` (a plain counter), see fence.lua; ARGV[5] expiry grace (see prologue.lua).
--
-- Replies: {1, fence, behind} granted (behind: µs the stored fence was ahead of the clock in
-- clock mode, else 0); {2, fence, 0} this owner already holds it (a resent script, no write);
-- {0, pttl, 0} held by another owner (`waiters` set, so the release announces: to the first
-- 8 characters of the owner token, which name the client, or `*` once several clients wait),
-- or yielded by this client to another one for pttl ms more (see handoff.lua); an error
-- reply (no write) when the next fence would pass 2^53 - 1 or the epoch cannot be read. Not
-- allow-oom: refused with OOM at maxmemory.
#!lua
if live then
  if owner == ARGV[1] then return {2, tonumber(lock[3]), 0} end
  local tag = string.sub(ARGV[1], 1, 8)
  local w = lock[5]
  if not w then redis.call('HSET', KEYS[1], 'waiters', tag)
  elseif w ~= '*' and w ~= tag and w ~= 'y' .. tag then redis.call('HSET', KEYS[1], 'waiters', '*') end
  return {0, expires - now_ms, 0}
end
if lock[5] and lock[5] == 'y' .. string.sub(ARGV[1], 1, 8) then
  if expires and expires > now_ms then return {0, expires - now_ms, 0} end
  redis.call('HDEL', KEYS[1], 'waiters')
end
local stored = tonumber(lock[3]) or 0
local fence, behind = next_fence(stored, tonumber(ARGV[3]), ARGV[4])
if not fence then return behind end
if lock[4] then clear(KEYS[1], lock) end
local ends = now_ms + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1],
  'until', string.format('%d', ends),
  'fence', string.format('%d', fence))
keep(KEYS[1], fence, ends)
return {1, fence, behind}
