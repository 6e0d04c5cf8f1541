-- The read-write lock's `set_until` (after rw_prologue.lua; it runs once per key), for the
-- scripts that move an owner's lease (rw_extend, rw_reenter).
--
-- `set_until(owner, role, ends, value)` sets the lease end of the owner's entry to `ends`: `wu`
-- for the writer (`role` `'w'`), else its reader entry `r:<owner>`, keeping the fence of
-- `value` (the entry as read).
local function set_until(owner, role, ends, value)
  if role == 'w' then
    redis.call('HSET', KEYS[1], 'wu', string.format('%d', ends))
  else
    redis.call('HSET', KEYS[1], 'r:' .. owner,
      string.format('%d:', ends) .. (string.match(value or '', ':(%d+)$') or '0'))
  end
end
