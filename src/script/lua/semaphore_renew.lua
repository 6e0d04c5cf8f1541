-- semaphore_renew: extend many owners' permits on one node in one call (the watchdog's batch;
-- own_prologue.lua first; semaphore.lua is inlined at each `--@sem` line, inside the blocks of
-- the rare paths, more than 512 arguments to one command: a renewal defines no function, and a
-- triple of a single permit, the common case, builds no table).
--
-- KEYS[1] one of the semaphore keys (routes the call). ARGV triples: semaphore key, holder
-- ("<owner token> <n1> <n2> ...", as for semaphore_extend), TTL in ms (keys of any slots this
-- node serves, allow-cross-slot-keys), then the expiry grace as the last ARGV. Each owner's
-- live permits are set as semaphore_extend sets them, reading only that owner's entries: a
-- triple costs O(its permits).
--
-- Replies: one code per triple: 1 extended, 0 no live permit of this owner, -2 none, and
-- `forced` names the owner: a forced unlock freed its permits (see semaphore_force_unlock.lua).
-- allow-oom.
#!lua flags=allow-oom,allow-cross-slot-keys
local codes = {}
for i = 1, #ARGV - 1, 3 do
  local key = ARGV[i]
  local ends = now_ms + ARGV[i + 2]
  local owner, n = string.match(ARGV[i + 1], '^(%S+) (%d+)$')
  local code = 0
  if owner then
    -- One permit number (the common case), as in semaphore_extend.lua.
    local v = redis.call('HGET', key, 'p:' .. n)
    local at = v and string.find(v, ' ', 1, true)
    if at and at > 1 then
      local e, f = string.match(v, '^(%d+) (%d+)$', at + 1)
      if e and e + 0 > now_ms and string.sub(v, 1, at - 1) == owner then
        redis.call('HSET', key, 'p:' .. n, string.format('%s %d %d', owner, ends, f))
        code = 1
      end
    end
  else
    -- Any other holder, as in semaphore_extend.lua.
    owner = string.match(ARGV[i + 1], '^(%S+)') or ''
    local fields = {}
    for m in string.gmatch(string.sub(ARGV[i + 1], #owner + 1), '%d+') do
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
      for j, field in ipairs(fields) do
        local v = values[j]
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
      if #writes > 0 then code = 1 end
    end
  end
  if code == 1 then
    -- the key's expiry, as sem_raise(key, ends) (semaphore.lua)
    if not grace then
      redis.call('PERSIST', key)
    else
      local target = string.format('%d', ends + grace)
      if redis.call('PEXPIREAT', key, target, 'GT') == 0 and redis.call('PEXPIRETIME', key) == -1 then
        redis.call('PEXPIREAT', key, target)
      end
    end
  else
    -- `forced` names this owner (as sem_forced, semaphore.lua)
    local list = redis.call('HGET', key, 'forced')
    if list and string.find(' ' .. list .. ' ', ' ' .. owner .. ' ', 1, true) then code = -2 end
  end
  codes[#codes + 1] = code
end
return codes
