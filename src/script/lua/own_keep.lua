-- The lock prologue's expiry rule `keep` for the scripts built on own_prologue.lua (inserted
-- after it and the fence rule; it runs once per script call, above the `--@key` line).
--
-- `keep(key, fence, ends)` is prologue.lua's `keep`, unchanged in effect: in a call that
-- granted (the fence rule set `memo.shift`) the key expires at max(ends, fence as ms) + grace;
-- any other call sets it to max(`ends`, fence as ms) + grace, unless the fence read as ms is
-- more than 1 ms ahead of `ends` (an epoch-clock fence; a clock fence granted in the current
-- millisecond reads as the next one, rounded up): then it only raises the expiry to
-- `ends + grace`, a key without an expiry getting one (one `PEXPIREAT ... GT`, and a
-- `PEXPIRETIME` only when that did not raise it); without a grace it removes any expiry.
local function keep(key, fence, ends)
  if not grace then return redis.call('PERSIST', key) end
  local fence_ms = math.ceil(((tonumber(fence) or 0) - (memo.shift or 0)) / 1000)
  if not memo.shift and fence_ms > ends + 1 then
    local target = string.format('%d', ends + grace)
    if redis.call('PEXPIREAT', key, target, 'GT') == 0 and redis.call('PEXPIRETIME', key) == -1 then
      redis.call('PEXPIREAT', key, target)
    end
    return
  end
  if fence_ms > ends then ends = fence_ms end
  redis.call('PEXPIREAT', key, string.format('%d', ends + grace))
end
--@key
