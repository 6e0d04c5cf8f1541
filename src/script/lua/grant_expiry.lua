-- keep.lua's `keep(KEYS[1], fence, ends)` for a grant, written out once for the scripts whose
-- common path defines no function: the mutex's and the fair lock's acquire inline it at their
-- `--@expiry` line, after the grant's write, with `fence` (a number) and `ends` (the lease end
-- in ms) set. A grant in clock or hybrid mode (`memo.shift` set) expires at max(ends, fence as
-- ms) + grace; in epoch mode, whose fence is far ahead of the clock, the expiry is only raised
-- to ends + grace; without a grace the key is kept for good.
do
  local latest = ends
  if not grace then
    redis.call('PERSIST', KEYS[1])
  elseif memo.shift then
    if fence - memo.shift > latest * 1000 then latest = math.ceil((fence - memo.shift) / 1000) end
    redis.call('PEXPIREAT', KEYS[1], string.format('%d', latest + grace))
  elseif fence > latest * 1000 then
    if redis.call('PEXPIRETIME', KEYS[1]) < latest + grace then
      redis.call('PEXPIREAT', KEYS[1], string.format('%d', latest + grace))
    end
  else
    redis.call('PEXPIREAT', KEYS[1], string.format('%d', latest + grace))
  end
end
