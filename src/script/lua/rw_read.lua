-- rw_read: grant a read hold of a read-write lock (own_prologue.lua, fence rule, rw_prologue.lua,
-- rw_forget.lua and rw_raise.lua first).
--
-- KEYS[1] the lock's hash (`fencelock:{NAME}:rw`). ARGV[1] owner token, ARGV[2] TTL in ms,
-- ARGV[3] floor (decimal, 0 for none), ARGV[4] fence mode (as acquire), ARGV[5] the most
-- live reader entries the lock may hold (`MAX_READERS`), ARGV[6] expiry grace.
--
-- While the hash has fewer fields than ARGV[5] nothing more is read. At or past it, every field
-- is read once (dead reader entries are deleted) and a new reader is refused while ARGV[5] live
-- reader entries remain: that bounds every call that reads all the readers. A refusal stores
-- `rs` = the first of those readers' lease end; until then, and while no reader entry goes
-- (`forget` deletes `rs`), new readers are refused without reading the fields again, so a burst
-- of reads on a full lock reads them once.
--
-- Replies: {1, fence, behind} granted: `r:<owner>` = `<now + TTL>:<fence>`, the fence a new
-- value of the counter; {2, fence, 0} this owner already reads (a resent script: its fence, no
-- write); {0, ms, 0} refused: a live writer, or a live writer intent (a writer waits: new
-- readers queue behind it), with the ms until that lease ends (every refusal leaves `waiters`
-- set, so the release, downgrade or withdrawal that may let it in announces); an error reply (no write) as the
-- fence rule says; {0, ms, readers} refused at ARGV[5] live readers, ms until the first of them
-- ends (at most a third of ARGV[2]). Not allow-oom.
#!lua
local mine = rw[5]
if mine and (tonumber(string.match(mine, '^(%d+)')) or 0) > now_ms then
  return {2, tonumber(string.match(mine, ':(%d+)$')) or 0, 0}
end
local blocked = writer_live and writer_until - now_ms or intent_live and intent_until - now_ms
if blocked then
  if not waiters then redis.call('HSET', KEYS[1], 'waiters', '1') end
  return {0, blocked, 0}
end
-- Without a stored fence no reader entry exists (every grant stores one, and it is never
-- removed), so the hash's length need not be read: the key is new when nothing at all was read.
local fresh = not (last_fence or intent or waiters or rw[7] or rw[8])
if not mine and last_fence and redis.call('HLEN', KEYS[1]) >= ARGV[5] + 0 then
  local cap = ARGV[5] + 0
  local third = math.max(1, math.floor(ARGV[2] / 3))
  local full = tonumber(rw[8])
  if full and full > now_ms then
    if not waiters then redis.call('HSET', KEYS[1], 'waiters', '1') end
    return {0, math.min(full - now_ms, third), cap}
  end
  local fields, readers, first, dead = redis.call('HGETALL', KEYS[1]), 0, nil, nil
  for n = 1, #fields, 2 do
    local field = fields[n]
    if string.sub(field, 1, 2) == 'r:' then
      local ends = tonumber(string.match(fields[n + 1], '^(%d+)')) or 0
      if ends > now_ms then
        readers = readers + 1
        if not first or ends < first then first = ends end
      else
        dead = dead or {}
        dead[string.sub(field, 3)] = true
      end
    end
  end
  if dead then forget_readers(fields, dead) end
  if readers >= cap then
    redis.call('HSET', KEYS[1], 'rs', string.format('%d', first), 'waiters', '1')
    return {0, math.min(first - now_ms, third), readers}
  end
end
local fence, behind = next_fence(tonumber(last_fence) or 0, ARGV[3], ARGV[4], nil, KEYS[1])
if not fence then return behind end
local ends = now_ms + ARGV[2]
local stored = string.format('%d', fence)
redis.call('HSET', KEYS[1], reader_field, string.format('%d:', ends) .. stored, 'fence', stored)
raise(fence, ends, fresh)
return {1, fence, behind}
