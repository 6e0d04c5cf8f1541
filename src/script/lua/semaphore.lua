-- The semaphore's layout, and the helpers every semaphore script calls (inserted after
-- own_prologue.lua and, in the scripts that grant, the fence rule and own_keep.lua). The helpers
-- below are split by who calls them: `sem_parse_permit`, `sem_parse_res`, `sem_permit`,
-- `sem_call` and `sem_mine` here; `sem_read`, `sem_held`, `sem_end` and `sem_expire` in
-- semaphore_scan.lua (the scripts that scan or grant). The acquire, the release, the extend and
-- the renewal take none of them up front: their code is inlined at each `--@sem` line of those
-- scripts, inside the blocks of their rare paths (script/catalog.rs), and their common paths do
-- the same work inline, so a one-permit grant from the index, a release of numbered permits, an
-- extend and a renewal define no function of these. `sem_raise` and `sem_forced` below name two
-- rules those scripts write inline (no function defines them).
--
-- One hash per semaphore, `<prefix>:{NAME}:sem`: `limit` (the number of permits), `fence` (the
-- last fence granted, never removed), one field `p:<n>` per permit number n that was ever
-- granted = "<owner> <lease end ms> <fence>" (live while the lease end is after now; lease end
-- 0 marks a permit its owner released), and `r` = "<waiter> <count> <end ms>", the reservation
-- of the first waiting many-permit requester; after a forced unlock that freed live permits,
-- `forced` = their owners' tokens, space separated (see semaphore_force_unlock.lua; no permit,
-- `sem_read` skips it); `waiters` = "1" while an acquire was refused since the last release
-- that announced (set by semaphore_acquire.lua, removed by semaphore_release.lua when it
-- publishes; no permit, `sem_read` skips it).
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
-- live} among those numbers; `sem_raise(key, ends)` (extend, renew) raises the
-- key's expiry to `ends` + grace unless it ends later (one `PEXPIREAT ... GT`, then, only when
-- that did not raise it and the key has no expiry, a plain `PEXPIREAT`; without a grace it
-- removes any expiry): a call that reads only its own permits cannot lower the expiry others
-- need; `sem_forced(key, owner)` (release, extend, renew) is true when `forced` names the
-- owner (one `HGET`, for failure paths only); `sem_permit(owner, ends, fence)` formats a permit entry (one `string.format`);
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
-- own_prologue.lua). `sem_parse_permit` finds the owner with a plain
-- `string.find` of the first space and matches only the two numbers after it (nil for an absent
-- value, without a match).
local function sem_parse_permit(n, value)
  if not value then return nil end
  local at = string.find(value, ' ', 1, true)
  if not at or at == 1 then return nil end
  local e, f = string.match(value, '^(%d+) (%d+)$', at + 1)
  if not e then return nil end
  e = e + 0
  return {n = n, owner = string.sub(value, 1, at - 1), ends = e, fence = f, live = e > now_ms}
end
local function sem_parse_res(value)
  if not value then return nil end
  local o, c, e = string.match(value, '^(%S+) (%d+) (%d+)$')
  if not o then return nil end
  return {owner = o, count = tonumber(c), ends = tonumber(e), live = tonumber(e) > now_ms}
end
local function sem_permit(owner, ends, fence)
  return string.format('%s %d %d', owner, ends, fence)
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
--@key
