-- The read-write lock's helpers for an owner's own entry (after own_keep.lua and rw_prologue.lua;
-- they run once per key): the scripts that end or move a hold take them; the grants (rw_read,
-- rw_write) do not pay for them.
--
-- `role()` → `'w'|'r'|nil, lease end, reader value` of the owner ARGV[1]; `settle()` after a
-- release: when no writer or reader entry is left (the hash's length, `HLEN`, less the fields
-- that are no hold, as `rw` has them now: see rw_prologue.lua), the key expires `grace` after
-- now (or after a live intent's end), by `keep`.
--@key
local function role()
  if writer == ARGV[1] then return 'w', writer_until or 0 end
  if rw[5] then return 'r', tonumber(string.match(rw[5], '^(%d+)')) or 0, rw[5] end
  return nil, 0
end
local function settle()
  local left = redis.call('HLEN', KEYS[1])
  for n = 3, 10 do
    if rw[n] and n ~= 5 and n ~= 6 then left = left - 1 end
  end
  local ends = now_ms
  local iu = tonumber(rw[4])
  if rw[3] and iu and iu > ends then ends = iu end
  if left <= 0 then keep(KEYS[1], last_fence, ends) end
end
