-- rw_write: grant the write hold of a read-write lock, or record this waiting writer's intent
-- (own_prologue.lua, fence rule, rw_state_all.lua, rw_forget.lua and rw_raise.lua first).
--
-- KEYS[1] the lock's hash. ARGV[1] owner token, ARGV[2] TTL in ms, ARGV[3] floor, ARGV[4]
-- fence mode (as acquire), ARGV[5] the waiting call's intent id (empty: a single attempt,
-- which records no intent), ARGV[6] expiry grace.
--
-- Granted when no live writer, no live reader and no live intent of another waiting call:
-- `w` = owner, `wu` = now + TTL, `fence` advanced, this call's intent removed → {1, fence,
-- behind}. {2, fence, 0}: this owner already writes (a resent script; no write). Refused →
-- {0, ms, fields} with the ms until the longest blocking lease ends, at most TTL / 3 when this
-- call keeps an intent (so the intent is refreshed before it lapses), and the hash's field
-- count (what this call read: the caller weighs its next call by it); the intent `i`/`iu` is
-- set (or refreshed) to this call's id and now + TTL unless another call's live intent is
-- first; `waiters` is set (so the release that may let it in announces). Dead reader entries
-- seen are deleted. An error reply (no write) as the fence rule says. Not allow-oom.
#!lua
if writer_live then
  if writer == ARGV[1] then return {2, tonumber(last_fence), 0} end
end
local ttl = ARGV[2] + 0
local blocked = 0
if writer_live then blocked = writer_until - now_ms end
local theirs = intent_live and intent ~= ARGV[5]
if theirs and intent_until - now_ms > blocked then blocked = intent_until - now_ms end
local fields, dead = all, nil
for n = 1, #fields, 2 do
  local field = fields[n]
  if string.sub(field, 1, 2) == 'r:' then
    local ends = tonumber(string.match(fields[n + 1], '^(%d+)')) or 0
    if ends > now_ms then
      if ends - now_ms > blocked then blocked = ends - now_ms end
    else
      dead = dead or {}
      dead[string.sub(field, 3)] = true
    end
  end
end
if dead then forget_readers(fields, dead) end
if blocked > 0 then
  if ARGV[5] ~= '' and not theirs then
    local ends = now_ms + ttl
    redis.call('HSET', KEYS[1], 'i', ARGV[5], 'iu', string.format('%d', ends), 'waiters', '1')
    raise(last_fence, ends)
    local third = math.max(1, math.floor(ttl / 3))
    if blocked > third then blocked = third end
  elseif not waiters then
    redis.call('HSET', KEYS[1], 'waiters', '1')
  end
  return {0, blocked, #fields / 2}
end
local fence, behind = next_fence(tonumber(last_fence) or 0, ARGV[3], ARGV[4], nil, KEYS[1])
if not fence then return behind end
if writer then forget(writer, 'w') end
local ends = now_ms + ttl
if intent then
  redis.call('HDEL', KEYS[1], 'i', 'iu')
end
redis.call('HSET', KEYS[1], 'w', ARGV[1], 'wu', string.format('%d', ends), 'fence',
  string.format('%d', fence))
raise(fence, ends, #fields == 0)
return {1, fence, behind}
