-- fair_renew: extend many fair-lock leases on one node in one call (the watchdog's batch;
-- renew_head.lua first).
--
-- KEYS[1] one of the fair lock keys (routes the call to the node serving its slot).
-- ARGV triples: fair lock key, owner token, TTL in ms (keys of any slots this node serves,
-- allow-cross-slot-keys), then the expiry grace as the last ARGV. As renew, but the key's
-- expiry is only raised (PEXPIRETIME), never lowered below what a waiting place needs.
--
-- Replies: one code per triple: 1 extended, 0 expired, -1 other owner, -2 freed by a forced
-- unlock (`forced`, see fair_force_unlock.lua). allow-oom.
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
    redis.call('HSET', key, 'until', string.format('%d %s %s', ends, fence, holder) .. marks)
    if grace then
      local current = redis.call('PEXPIRETIME', key)
      if current < 0 or current < ends + grace then
        redis.call('PEXPIREAT', key, string.format('%d', ends + grace))
      end
    else
      redis.call('PERSIST', key)
    end
    codes[#codes + 1] = 1
  end
end
return codes
