-- rw_renew: renew many read-write lock holds on one node in one call (the watchdog's batch;
-- renew_head.lua first).
-- Each triple touches only its owner's own entry: `w`/`wu` when the owner writes, else
-- `r:<owner>`; no other reader's lease moves.
--
-- KEYS[1] one of the keys (routes the call). ARGV triples: key, owner token, TTL in ms (keys of
-- any slots this node serves, allow-cross-slot-keys), then the expiry grace as the last ARGV.
--
-- Replies: one code per triple: 1 renewed, 0 no live entry of this owner, -1 gone and another
-- owner writes, -2 (before -1/0) the hash's `forced` names the owner: a forced unlock freed it
-- (see rw_force_unlock.lua; the `HGET` runs only for a triple that is not renewed). allow-oom.
#!lua flags=allow-oom,allow-cross-slot-keys
for n = 1, #ARGV - 1, 3 do
  local key, owner = ARGV[n], ARGV[n + 1]
  local state = redis.call('HMGET', key, 'w', 'wu', 'r:' .. owner, 'c:' .. owner, 'fence')
  local code, expires = 0, 0
  local ends = now_ms + tonumber(ARGV[n + 2])
  if state[1] == owner then
    expires = tonumber(state[2]) or 0
    if expires > now_ms then
      if state[4] and expires > ends then ends = expires end
      redis.call('HSET', key, 'wu', string.format('%.0f', ends))
      code = 1
    end
  elseif state[3] then
    expires = tonumber(string.match(state[3], '^(%d+)')) or 0
    if expires > now_ms then
      if state[4] and expires > ends then ends = expires end
      redis.call('HSET', key, 'r:' .. owner,
        string.format('%.0f', ends) .. ':' .. (string.match(state[3], ':(%d+)$') or '0'))
      code = 1
    end
  elseif state[1] and (tonumber(state[2]) or 0) > now_ms then
    code = -1
  end
  if code ~= 1 then
    local list = redis.call('HGET', key, 'forced')
    if list and string.find(' ' .. list .. ' ', ' ' .. owner .. ' ', 1, true) then code = -2 end
  end
  if code == 1 then
    if grace then
      local target = ends + grace
      if redis.call('PEXPIRETIME', key) < target then
        redis.call('PEXPIREAT', key, string.format('%.0f', target))
      end
    else
      redis.call('PERSIST', key)
    end
  end
  codes[#codes + 1] = code
end
return codes
