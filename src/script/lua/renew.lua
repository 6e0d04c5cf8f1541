-- renew: extend many leases on one node in one call (the watchdog's batch; renew_head.lua
-- first).
--
-- KEYS[1] one of the lock keys (routes the call to the node serving its slot).
-- ARGV triples: lock key, owner token, TTL in ms (keys of any slots this node serves,
-- allow-cross-slot-keys: undeclared keys are reached through ARGV, which Redis 7 permits for
-- keys of local slots), then the expiry grace as the last ARGV. A key of a slot this node does
-- not serve fails the whole call with an error after the keys before it were renewed; the
-- caller then renews slot by slot.
--
-- Each lease is set as extend.lua sets it (the state of key layout 2, prologue.lua; a key of
-- layout 1 reads as expired) (never shortened while the lock has several holds).
-- Each extended key's expiry is raised (never lowered) to its lease end + grace: the grant's
-- expiry already covers the fence.
--
-- Replies: one code per triple: 1 extended, 0 expired, -1 other owner, -2 (before -1/0) this
-- owner's hold was freed by a forced unlock (`forced`, see force_unlock.lua). allow-oom.
#!lua flags=allow-oom,allow-cross-slot-keys
for i = 1, #ARGV - 1, 3 do
  local key = ARGV[i]
  local state = redis.call('HGET', key, 'until')
  local expires, fence, holder, marks
  if state then expires, fence, holder, marks = string.match(state, '^(%d+) (%d+) (%S*)(.*)$') end
  expires = tonumber(expires)
  local live = holder and holder ~= '' and expires and expires > now_ms
  if not (live and holder == ARGV[i + 1]) and redis.call('HGET', key, 'forced') == ARGV[i + 1] then
    codes[#codes + 1] = -2
  elseif not live then
    codes[#codes + 1] = 0
  elseif holder ~= ARGV[i + 1] then
    codes[#codes + 1] = -1
  else
    local ends = now_ms + tonumber(ARGV[i + 2])
    if (tonumber(string.match(marks, ' h(%d+)')) or 1) > 1 and expires > ends then ends = expires end
    redis.call('HSET', key, 'until', string.format('%d %s %s', ends, fence, holder) .. marks)
    if grace then
      redis.call('PEXPIREAT', key, string.format('%d', ends + grace), 'GT')
    else
      redis.call('PERSIST', key)
    end
    codes[#codes + 1] = 1
  end
end
return codes
