-- The semaphore's state, shared by its scripts (inserted after the prologue and the fence rule).
--
-- One hash per semaphore, `<prefix>:{NAME}:sem`: `limit` (the number of permits), `fence` (the
-- last fence granted, never removed), one field `p:<n>` per permit number n that was ever
-- granted = "<owner> <lease end ms> <fence>" (live while the lease end is after now; lease end
-- 0 marks a permit its owner released), and `r` = "<waiter> <count> <end ms>", the reservation
-- of the first waiting many-permit requester; after a forced unlock that freed live permits,
-- `forced` = their owners' tokens, space separated (see semaphore_force_unlock.lua; no permit,
-- `sem_read` skips it).
--
-- So that a grant touches only what it takes (not every entry, as up to this version: O(limit)),
-- the hash also keeps an index, written by the scripts of this layout alongside the entries and
-- ignored by every reader of entries (older clients' scripts, inspection): `top` the lowest
-- number not taken since the last scan (every number from it up to the limit is free), `free`
-- the other free numbers, space separated (most recently released first; one at or above a
-- lowered limit is skipped), `sf` = "<fence> <limit>" as the index was last written (it is
-- trusted only while both still match: a grant or limit change of an older client's script
-- writes neither; above 32 permits followed by 64 dashes: a value longer than Redis's
-- `hash-max-listpack-value`, 64 by default, keeps the hash a hash table, whose field lookups
-- do not scan the hash as a listpack's do, measured 1.1M instructions per acquire + release
-- pair at 200 permits held as a listpack), and `o:<owner>` = that owner's permit numbers, space separated (what a
-- resent acquire and a release without numbers read). An expired permit keeps its number until
-- a scan reclaims it: an acquire scans every entry, as before, only when the index is not
-- trusted or yields too few numbers, and writes it afresh (deleting dead entries and the `o:`
-- fields of owners without a live permit; while a live permit's number is at or above the
-- limit, the index is left untrusted, so no grant passes a lowered limit). Releases and forced
-- unlocks of older clients only free permits the index then still counts as taken: found by
-- the next scan. Each number holds one live entry and every number is below the limit, so no
-- grant exceeds it.
--
-- `sem_read(key)` returns {limit, fence, permits = list of {n, owner, ends, fence, live},
-- res = {owner, count, ends, live} or nil, index = the owners with an `o:` field} (`sem_parse_permit(n, value)` and
-- `sem_parse_res(value)` parse one entry); `sem_end(s)` the latest end a live entry needs (at
-- least now); `sem_mine(key, holder)` reads only a holder's permits: `holder` is
-- "<owner> <n1> <n2> ..." (the owner token and its permit numbers, as extend and renew get
-- it), and it returns the owner and the list of its live permits {n, owner, ends, fence,
-- live} among those numbers; `sem_raise(key, ends)` raises the
-- key's expiry to `ends` + grace unless it ends later (without a grace it removes any expiry):
-- a call that reads only its own permits cannot lower the expiry others need;
-- `sem_forced(key, owner)` is true when `forced` names the owner (one `HGET`, for failure
-- paths only); `sem_permit(owner, ends, fence)` formats a permit entry (one `string.format`);
-- `sem_held(mine)` the reply {2, fence1, 0, n1, fence1, ...} to a resent acquire whose live
-- permits are `mine`; `sem_expire(key, fresh, fence, ends)` after a grant: the key expires at
-- max(ends, fence as ms) + grace (the prologue's `keep` rule for a granting call), set
-- outright on a key this call created (`fresh`), else only raised (`PEXPIREAT ... GT`: a grant
-- that reads no other entry cannot lower the expiry they need; a key without an expiry keeps
-- none); `sem_call(verb, key, args)` sends `verb key args...` in chunks of at most 512 arguments (`HSET` field/value pairs,
-- `HDEL`/`HMGET` fields; `unpack` of an unbounded table fails past ~8,000 values) and returns
-- the replies of `HMGET` chunks joined (one chunk: the command's own reply). The client bounds every table a script builds: at most
-- `MAX_PERMITS` entries (src/semaphore/mod.rs). None of them reads a key's state but through
-- its arguments: all of it runs once per script call (it ends with the `--@key` line, see
-- prologue.lua).
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
local function sem_permit(owner, ends, fence)
  return string.format('%s %.0f %.0f', owner, ends, fence)
end
local function sem_expire(key, fresh, fence, ends)
  if not grace then return redis.call('PERSIST', key) end
  if memo.shift then
    local fence_ms = math.ceil((fence - memo.shift) / 1000)
    if fence_ms > ends then ends = fence_ms end
  end
  if fresh then return redis.call('PEXPIREAT', key, ends + grace) end
  redis.call('PEXPIREAT', key, ends + grace, 'GT')
end
local function sem_call(verb, key, args)
  if #args <= 512 then
    if #args == 0 then return {} end
    return redis.call(verb, key, unpack(args))
  end
  local out = {}
  for i = 1, #args, 512 do
    local part = redis.call(verb, key, unpack(args, i, math.min(i + 511, #args)))
    if verb == 'HMGET' then
      for j = 1, #part do out[#out + 1] = part[j] end
    end
  end
  return out
end
local function sem_mine(key, holder)
  local owner = string.match(holder, '^(%S+)') or ''
  local fields, numbers = {}, {}
  for n in string.gmatch(string.sub(holder, #owner + 1), '%d+') do
    numbers[#numbers + 1] = tonumber(n)
    fields[#fields + 1] = 'p:' .. n
  end
  local mine = {}
  if #fields == 0 then return owner, mine end
  local values = sem_call('HMGET', key, fields)
  for i, n in ipairs(numbers) do
    local p = sem_parse_permit(n, values[i])
    if p and p.live and p.owner == owner then mine[#mine + 1] = p end
  end
  return owner, mine
end
local function sem_forced(key, owner)
  local list = redis.call('HGET', key, 'forced')
  return list and string.find(' ' .. list .. ' ', ' ' .. owner .. ' ', 1, true) ~= nil or false
end
local function sem_raise(key, ends)
  if not grace then return redis.call('PERSIST', key) end
  local current = redis.call('PEXPIRETIME', key)
  if current < ends + grace then
    redis.call('PEXPIREAT', key, ends + grace)
  end
end
--@key
