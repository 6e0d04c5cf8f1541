-- rw_reenter: add a hold to this owner's read entry or write hold (own_prologue.lua,
-- own_keep.lua, rw_prologue.lua, rw_entry.lua, rw_notice.lua, rw_lease.lua and rw_raise.lua
-- first). A writer may add read or write holds; a reader only read holds.
--
-- KEYS[1] the lock's hash. ARGV[1] owner token, ARGV[2] a fresh hold id (hex), ARGV[3] TTL in
-- ms (the lease moves to now + TTL unless it ends later), ARGV[4] `r` or `w` (the hold asked
-- for), ARGV[5] expiry grace. Holds: `c:<owner>` (count) and `h:<owner>:<id>` per hold (`<id>`
-- empty for the first); a resent script adds no second hold.
--
-- Replies: {1, fence, remaining ms} entered (fence: the owner's); {0, 0, 0} no live entry of
-- this owner; {-1, 0, 0} it is gone and another owner writes; {-2, 0, 0} a reader asked for a
-- write hold (upgrade refused, nothing written); {-3, 0, 0} (before -1/0) the owner's entry is
-- gone and `forced` names it: a forced unlock freed it (see rw_force_unlock.lua; -3, as -2 is
-- taken). Not allow-oom.
#!lua
local role, expires, value = role()
if not role then
  if was_forced(ARGV[1]) then return {-3, 0, 0} end
  if writer_live then return {-1, 0, 0} end
  return {0, 0, 0}
end
if expires <= now_ms then return {0, 0, 0} end
if role == 'r' and ARGV[4] == 'w' then return {-2, 0, 0} end
local count = holds
local prefix = 'h:' .. ARGV[1] .. ':'
if not count then
  redis.call('HSET', KEYS[1], prefix, 1, prefix .. ARGV[2], 1, 'c:' .. ARGV[1], 2)
elseif redis.call('HSETNX', KEYS[1], prefix .. ARGV[2], 1) == 1 then
  redis.call('HSET', KEYS[1], 'c:' .. ARGV[1], string.format('%d', count + 1))
end
local ends = now_ms + tonumber(ARGV[3])
if ends > expires then set_until(ARGV[1], role, ends, value) else ends = expires end
raise(last_fence, ends)
local fence = tonumber(last_fence)
if role == 'r' then fence = tonumber(string.match(value or '', ':(%d+)$')) end
return {1, fence, ends - now_ms}
