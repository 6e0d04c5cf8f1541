-- The read-write lock's `raise` (after rw_prologue.lua; it runs once per key): the key's expiry
-- as raise.lua's `raise` sets it, whose key may hold other callers' live entries (readers, an
-- intent) that a call does not read.
--
-- `raise(fence, ends, fresh)` sets the key to expire at max(ends, fence as ms) + grace unless
-- it expires later already (the fence counts only in a call that granted: the fence rule set
-- `memo.shift`), so an expiry a live entry needs is never shortened; a key without an expiry
-- gets one. One `PEXPIREAT ... GT` when that raises it, a `PEXPIRETIME` only when it did not;
-- set outright when `fresh` (the key did not exist before this call: no expiry to keep).
-- Without a grace (counter and epoch modes) it removes any expiry.
local function raise(fence, ends, fresh)
  if not grace then return redis.call('PERSIST', KEYS[1]) end
  if memo.shift then
    local fence_ms = math.ceil(((tonumber(fence) or 0) - memo.shift) / 1000)
    if fence_ms > ends then ends = fence_ms end
  end
  local target = string.format('%d', ends + grace)
  if fresh then return redis.call('PEXPIREAT', KEYS[1], target) end
  if redis.call('PEXPIREAT', KEYS[1], target, 'GT') == 0
    and redis.call('PEXPIRETIME', KEYS[1]) == -1 then
    redis.call('PEXPIREAT', KEYS[1], target)
  end
end
