-- The semaphore's scan and grant helpers (after semaphore.lua; they run once per script call,
-- above the `--@key` line), for the scripts that read every entry or grant: semaphore_acquire,
-- semaphore_available, semaphore_set_limit, semaphore_force_unlock. A release does not pay for
-- them (each function a script defines costs it per call, see own_prologue.lua).
--
-- `sem_read`, `sem_held`, `sem_end` and `sem_expire` as semaphore.lua describes them.
local function sem_read(key)
  local s = {fence = 0, permits = {}, index = {}}
  local flat = redis.call('HGETALL', key)
  for i = 1, #flat, 2 do
    local field, value = flat[i], flat[i + 1]
    if field == 'limit' then
      s.limit = tonumber(value)
    elseif field == 'fence' then
      s.fence = tonumber(value) or 0
    elseif field == 'r' then
      s.res = sem_parse_res(value)
    elseif string.sub(field, 1, 2) == 'o:' then
      s.index[#s.index + 1] = string.sub(field, 3)
    else
      local n = string.match(field, '^p:(%d+)$')
      local p = n and sem_parse_permit(tonumber(n), value)
      if p then s.permits[#s.permits + 1] = p end
    end
  end
  return s
end
local function sem_held(mine)
  table.sort(mine, function(a, b) return a.n < b.n end)
  local reply = {2, tonumber(mine[1].fence), 0}
  for _, p in ipairs(mine) do
    reply[#reply + 1] = p.n
    reply[#reply + 1] = tonumber(p.fence)
  end
  return reply
end
local function sem_end(s)
  local ends = now_ms
  for _, p in ipairs(s.permits) do
    if p.live and p.ends > ends then ends = p.ends end
  end
  if s.res and s.res.live and s.res.ends > ends then ends = s.res.ends end
  return ends
end
local function sem_expire(key, fresh, fence, ends)
  if not grace then return redis.call('PERSIST', key) end
  if memo.shift then
    local fence_ms = math.ceil((fence - memo.shift) / 1000)
    if fence_ms > ends then ends = fence_ms end
  end
  local target = string.format('%d', ends + grace)
  if fresh then return redis.call('PEXPIREAT', key, target) end
  redis.call('PEXPIREAT', key, target, 'GT')
end
--@key
