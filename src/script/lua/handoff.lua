-- handoff: release one hold of owner A and, when that frees the lock, grant it in the same call
-- to owner B, a waiting task of the same client, with the fence rule (lock prologue, fence
-- rule and keep.lua first; a call that meets a queue runs raise.lua and the queue snippet fair.lua, inlined
-- at its `--@queue` line). A grant costs one call when the next holder waits in the releasing client.
--
-- `handoff_floor` is this script with the floor read of `floor_read.lua` in its fence rule (a
-- lock without a key, in a clock mode, takes the floor key of a module that deletes released
-- locks' keys as its last fence): the same KEYS, ARGV and replies.
--
-- KEYS[1] the lock key. ARGV[1] owner A's token, ARGV[2] A's hold id (empty for the hold the
-- acquire granted), ARGV[3] announce: `s` SPUBLISH, `p` PUBLISH, empty for none; ARGV[4] owner
-- B's token (same client: same first 8 characters as A's), ARGV[5] B's TTL in ms, ARGV[6] B's
-- floor, ARGV[7] fence mode (as acquire's ARGV[3] and ARGV[4]); ARGV[8] yield in ms; ARGV[9]
-- fences to take for B (1, or more to reserve the next ones for B's client to hand on within
-- itself under B's token: the stored `fence` is then the last of them); ARGV[10] `c` for a
-- cohort (A's hold was granted after A waited behind other clients' places, so B is handed the
-- lock ahead of the queue once, see below), else empty; ARGV[11] expiry grace.
--
-- The lock is handed to B only while no other client waits: `waiters` is unset or names this
-- client (the first 8 characters of an owner token, `y` before them for a yield), or is `q` with
-- no live place found (when index entries remain past the walk's 64, or the hash holds places
-- without one, B's grant keeps the `q` mark and only raises the expiry, so the next release
-- goes on with the queue). With a live place queued (acquire.lua) the lock goes to the head place
-- as release.lua hands it, and B asks on its own (it takes a place), unless ARGV[10] is `c`
-- and A's hold was live (code 1): then B is granted ahead of the places, the queue and its `q` mark stay (the release that ends
-- B's fences hands the lock to the head), and the key's expiry is only raised (`raise`: the
-- places' leases need it). So a client that waited its turn keeps the lock for at most the
-- fences this call takes before the next client's turn. Else it is
-- freed and announced as by release, and the state's waiters mark is left as `y<client>` with
-- its lease end ARGV[8] ms ahead: until then acquires of this client find it busy (and the release of whoever takes
-- it meanwhile announces), so the other client's woken waiter gets in first.
--
-- Replies {code, handed, fence, behind}: code as release's (1 released, 0 no live lease,
-- -1 held by another owner, left alone); handed 1: granted to B with `fence`, the first of the
-- fences taken (`behind` as
-- acquire's); 0: not freed (A's other holds remain) or held by another owner; 2: freed and not
-- handed (another client waits, or the fence rule refused: B then attempts and sees why).
-- Not allow-oom: it may grant. No batch twin: the client sends it on its own.
#!lua
local code = 1
if owner ~= ARGV[1] then
  if live then return {-1, 0, 0, 0} end
  code = 0
elseif not live then
  code = 0
elseif lock[4] or ARGV[2] ~= '' then
  if redis.call('HDEL', KEYS[1], 'h:' .. ARGV[2]) == 0 then return {1, 0, 0, 0} end
  local holds = (lock[4] or 1) - 1
  if holds > 0 then
    lock[4] = holds
    store(KEYS[1], lock)
    return {1, 0, 0, 0}
  end
end
local tag = string.sub(ARGV[1], 1, 8)
local others
if lock[5] == 'q' then
--@queue
  local q, pending, last = head()
  -- No live place within the walk's reach, but entries remain past it (or places without one):
  -- B is granted as the first caller would be, and the queue keeps its mark.
  local beyond = not q and (pending or redis.call('HLEN', KEYS[1]) > 3)
  if beyond or (q and ARGV[10] == 'c' and code == 1) then
    local reserve = tonumber(ARGV[9]) or 1
    local fence, behind = next_fence((lock[3] or 0) + 0, ARGV[6], ARGV[7], reserve, KEYS[1])
    if fence then
      if lock[4] then clear(KEYS[1], lock) end
      local ends = now_ms + ARGV[5]
      local last = fence + reserve - 1
      store(KEYS[1], {ARGV[4], ends, last, nil, 'q'})
      raise(last, ends)
      return {code, 1, fence, behind}
    end
  end
  if q or beyond then
    if lock[4] then clear(KEYS[1], lock) end
    hand_head(ARGV[3], lock[3], q, pending, last)
    return {code, 2, 0, 0}
  end
  others = false
else
  others = lock[5] and lock[5] ~= tag and lock[5] ~= 'y' .. tag
end
local fence, behind
local reserve = tonumber(ARGV[9]) or 1
if not others then fence, behind = next_fence((lock[3] or 0) + 0, ARGV[6], ARGV[7], reserve, KEYS[1]) end
if not fence then
  clear(KEYS[1], lock)
  if others then store(KEYS[1], {nil, now_ms + ARGV[8], lock[3], nil, 'y' .. tag}) end
  if lock[5] then
    if ARGV[3] == 's' then redis.call('SPUBLISH', KEYS[1], '')
    elseif ARGV[3] == 'p' then redis.call('PUBLISH', KEYS[1], '') end
  end
  return {code, 2, 0, 0}
end
if lock[4] then clear(KEYS[1], lock) end
local ends = now_ms + ARGV[5]
local last = fence + reserve - 1
store(KEYS[1], {ARGV[4], ends, last})
keep(KEYS[1], last, ends)
return {code, 1, fence, behind}
