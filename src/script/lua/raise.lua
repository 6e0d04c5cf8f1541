-- The expiry that is only ever raised, shared by the fair lock's and the read-write lock's
-- scripts, whose key may hold other callers' live entries (waiting places, readers) that a
-- call does not read (inserted after the prologue and the fence rule, before `fair.lua` or
-- `rw_prologue.lua`; it runs once per key).
--
-- `raise(fence, ends, key)` sets `key` (KEYS[1] when nil) to expire at max(ends, fence as ms)
-- + grace unless it expires later already (PEXPIRETIME; a key without an expiry, -1, gets one), so an expiry a
-- live entry needs is never shortened. The fence counts only in a call that granted (the fence
-- rule set `memo.shift`), as in the prologue's `keep`. Without a grace (counter and epoch
-- modes) it removes any expiry.
local function raise(fence, ends, key)
  key = key or KEYS[1]
  if not grace then return redis.call('PERSIST', key) end
  if memo.shift then
    local fence_ms = math.ceil(((tonumber(fence) or 0) - memo.shift) / 1000)
    if fence_ms > ends then ends = fence_ms end
  end
  local target = ends + grace
  local current = redis.call('PEXPIRETIME', key)
  if current < target then
    redis.call('PEXPIREAT', key, string.format('%d', target))
  end
end
