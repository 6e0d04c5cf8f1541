-- semaphore_extend: move the lease end of this owner's live permits to now + TTL (own_prologue.lua
-- first; semaphore.lua is inlined at each `--@sem` line, inside the blocks of the rare paths,
-- more than 512 arguments to one command: an extend defines no function, and one of a single
-- permit, the common case, builds no table but its reply).
--
-- KEYS[1] the semaphore key. ARGV[1] the holder: "<owner token> <n1> <n2> ...", its permit
-- numbers (the hold id) after the token, ARGV[2] TTL in ms, ARGV[3] expiry grace.
--
-- Reads only those permits' entries, O(their count), as `sem_mine` reads them (semaphore.lua);
-- each live one of this owner gets lease end now + TTL, keeping its fence; the key's expiry is
-- only raised, to cover the new lease end (as `sem_raise`, semaphore.lua).
--
-- Replies: {1, TTL ms} extended; {0, 0} no live permit of this owner (expired or unknown);
-- {-2, 0} none, and `forced` names the owner: a forced unlock freed its permits (see
-- semaphore_force_unlock.lua). allow-oom.
#!lua flags=allow-oom
local key = KEYS[1]
local ends = now_ms + ARGV[2]
local owner, n = string.match(ARGV[1], '^(%S+) (%d+)$')
local extended = false
if owner then
  -- One permit number (the common case): one `HGET`, its entry parsed as sem_parse_permit does
  -- (semaphore.lua): owner, lease end, fence.
  local v = redis.call('HGET', key, 'p:' .. n)
  local at = v and string.find(v, ' ', 1, true)
  if at and at > 1 then
    local e, f = string.match(v, '^(%d+) (%d+)$', at + 1)
    if e and e + 0 > now_ms and string.sub(v, 1, at - 1) == owner then
      redis.call('HSET', key, 'p:' .. n, string.format('%s %d %d', owner, ends, f))
      extended = true
    end
  end
else
  -- Any other holder: its numbers and the owner as sem_mine finds them (semaphore.lua).
  owner = string.match(ARGV[1], '^(%S+)') or ''
  local fields = {}
  for m in string.gmatch(string.sub(ARGV[1], #owner + 1), '%d+') do
    fields[#fields + 1] = 'p:' .. m
  end
  if #fields > 0 then
    local values
    if #fields <= 512 then
      values = redis.call('HMGET', key, unpack(fields))
    else
--@sem
      values = sem_call('HMGET', key, fields)
    end
    local writes = {}
    for i, field in ipairs(fields) do
      local v = values[i]
      local at = v and string.find(v, ' ', 1, true)
      if at and at > 1 then
        local e, f = string.match(v, '^(%d+) (%d+)$', at + 1)
        if e and e + 0 > now_ms and string.sub(v, 1, at - 1) == owner then
          writes[#writes + 1] = field
          writes[#writes + 1] = string.format('%s %d %d', owner, ends, f)
        end
      end
    end
    if #writes > 512 then
--@sem
      sem_call('HSET', key, writes)
    elseif #writes > 0 then
      redis.call('HSET', key, unpack(writes))
    end
    extended = #writes > 0
  end
end
if extended then
  -- the key's expiry, as sem_raise(key, ends) (semaphore.lua)
  if not grace then
    redis.call('PERSIST', key)
  else
    local target = string.format('%d', ends + grace)
    if redis.call('PEXPIREAT', key, target, 'GT') == 0 and redis.call('PEXPIRETIME', key) == -1 then
      redis.call('PEXPIREAT', key, target)
    end
  end
  return {1, ARGV[2] + 0}
end
-- `forced` names this owner (as sem_forced, semaphore.lua)
local list = redis.call('HGET', key, 'forced')
if list and string.find(' ' .. list .. ' ', ' ' .. owner .. ' ', 1, true) then return {-2, 0} end
return {0, 0}
