-- fair_renew_place: keep waiting places alive, many on one node in one call (the watchdog's batch,
-- for waiting fair-lock calls; renew_head.lua first). Touches only the `q:<owner>` field of each
-- place.
--
-- KEYS[1] one of the fair lock keys (routes the call). ARGV triples: fair lock key, owner
-- token, place lease in ms (keys of any slots this node serves, allow-cross-slot-keys), then
-- the expiry grace as the last ARGV.
--
-- A live place's lease end moves to now + lease (its seq, the arrival, is kept) and the key's
-- expiry is raised to cover it. A place that is gone because its owner was granted the lock
-- counts as renewed (no write).
--
-- Replies: one code per triple: 1 renewed (or granted meanwhile), 0 the place is gone (its
-- lease ended, or it was withdrawn). allow-oom: it never adds a field.
#!lua flags=allow-oom,allow-cross-slot-keys
for i = 1, #ARGV - 1, 3 do
  local key, who = ARGV[i], ARGV[i + 1]
  local place = redis.call('HGET', key, 'q:' .. who)
  local seq, ends
  if place then seq, ends = string.match(place, '^(%d+) (%d+)$') end
  if ends and tonumber(ends) > now_ms then
    local until_ms = now_ms + tonumber(ARGV[i + 2])
    redis.call('HSET', key, 'q:' .. who, seq .. ' ' .. string.format('%d', until_ms))
    if grace then
      local current = redis.call('PEXPIRETIME', key)
      if current >= 0 and current < until_ms + grace then
        redis.call('PEXPIREAT', key, string.format('%d', until_ms + grace))
      end
    end
    codes[#codes + 1] = 1
  elseif string.match(redis.call('HGET', key, 'until') or '', '^%d+ %d+ (%S*)') == who then
    codes[#codes + 1] = 1
  else
    codes[#codes + 1] = 0
  end
end
return codes
