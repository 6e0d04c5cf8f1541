-- The read-write lock's `forget` (after rw_prologue.lua; it runs once per key).
--
-- `forget(owner, role, and_waiters)` removes an entry and its holds: `role` `'w'` the writer's
-- `w` and `wu`, else the reader entry `r:<owner>` and `rs` (a reader entry going may let a
-- refused read in); `waiters` too when `and_waiters`, in the same `HDEL`; then the owner's
-- `c:<owner>` and every `h:<owner>:*` field (for the owner ARGV[1] it looks for no `c:` field
-- when `holds` says there is none). It keeps `rw` in step (see rw_prologue.lua).
-- `forget_readers(all, dead)`: `forget(owner, 'r')` for every owner of the set `dead` (dead
-- reader entries), in one pass over `all`, the hash as this call's `HGETALL` read it: their
-- `r:`, `c:` and `h:<owner>:*` fields and `rs` go in `HDEL`s of at most 512 fields (one `HKEYS`
-- per re-entered reader made the work grow with readers times fields).
local function forget(owner, role, and_waiters)
  local a, b = 'w', 'wu'
  if role ~= 'w' then
    a, b = owner == ARGV[1] and reader_field or 'r:' .. owner, 'rs'
    rw[8] = false
  end
  local also = and_waiters and 'waiters' or nil
  if also then rw[10] = false end
  if owner == ARGV[1] and not holds then
    if also then return redis.call('HDEL', KEYS[1], a, b, also) end
    return redis.call('HDEL', KEYS[1], a, b)
  end
  local fields = {a, b, also}
  if owner == ARGV[1] then
    fields[#fields + 1] = 'c:' .. owner
    redis.call('HDEL', KEYS[1], unpack(fields))
  else
    redis.call('HDEL', KEYS[1], unpack(fields))
    if redis.call('HDEL', KEYS[1], 'c:' .. owner) == 0 then return end
  end
  local prefix = 'h:' .. owner .. ':'
  fields = {}
  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(field, 1, #prefix) == prefix then fields[#fields + 1] = field end
  end
  for n = 1, #fields, 512 do
    redis.call('HDEL', KEYS[1], unpack(fields, n, math.min(n + 511, #fields)))
  end
end
local function forget_readers(all, dead)
  local gone = {'rs'}
  for n = 1, #all, 2 do
    local field = all[n]
    local kind = string.sub(field, 1, 2)
    local owner
    if kind == 'r:' or kind == 'c:' then
      owner = string.sub(field, 3)
    elseif kind == 'h:' then
      owner = string.match(field, '^h:(.*):')
    end
    if owner and dead[owner] then gone[#gone + 1] = field end
  end
  rw[8] = false
  for n = 1, #gone, 512 do
    redis.call('HDEL', KEYS[1], unpack(gone, n, math.min(n + 511, #gone)))
  end
end
