-- The semaphore's state, shared by its scripts (inserted after the prologue and the fence rule).
--
-- One hash per semaphore, `<prefix>:{NAME}:sem`: `limit` (the number of permits), `fence` (the
-- last fence granted, never removed), one field `p:<n>` per permit number n that was ever
-- granted = "<owner> <lease end ms> <fence>" (live while the lease end is after now; lease end
-- 0 marks a permit its owner released), and `r` = "<waiter> <count> <end ms>", the reservation
-- of the first waiting many-permit requester.
--
-- `sem_read(key)` returns {limit, fence, permits = list of {n, owner, ends, fence, live},
-- res = {owner, count, ends, live} or nil} (`sem_parse_permit(n, value)` and
-- `sem_parse_res(value)` parse one entry); `sem_end(s)` the latest end a live entry needs (at
-- least now); `sem_permit(owner, ends, fence)` formats a permit entry. None of them reads a key's
-- state but through its arguments: all of it runs once per script call (it ends with the
-- `--@key` line, see prologue.lua).
local function sem_parse_permit(n, value)
  local o, e, f = string.match(value or '', '^(%S+) (%d+) (%d+)$')
  if not o then return nil end
  local p = {n = n, owner = o, ends = tonumber(e), fence = f}
  p.live = p.ends > now_ms
  return p
end
local function sem_parse_res(value)
  local o, c, e = string.match(value or '', '^(%S+) (%d+) (%d+)$')
  if not o then return nil end
  return {owner = o, count = tonumber(c), ends = tonumber(e), live = tonumber(e) > now_ms}
end
local function sem_read(key)
  local s = {fence = 0, permits = {}}
  local flat = redis.call('HGETALL', key)
  for i = 1, #flat, 2 do
    local field, value = flat[i], flat[i + 1]
    if field == 'limit' then
      s.limit = tonumber(value)
    elseif field == 'fence' then
      s.fence = tonumber(value) or 0
    elseif field == 'r' then
      s.res = sem_parse_res(value)
    else
      local n = string.match(field, '^p:(%d+)$')
      local p = n and sem_parse_permit(tonumber(n), value)
      if p then s.permits[#s.permits + 1] = p end
    end
  end
  return s
end
local function sem_end(s)
  local ends = now_ms
  for _, p in ipairs(s.permits) do
    if p.live and p.ends > ends then ends = p.ends end
  end
  if s.res and s.res.live and s.res.ends > ends then ends = s.res.ends end
  return ends
end
local function sem_permit(owner, ends, fence)
  return owner .. ' ' .. string.format('%.0f', ends) .. ' ' .. string.format('%.0f', fence)
end
--@key
