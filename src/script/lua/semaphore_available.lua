-- semaphore_available: the stored limit and how many permits are live (own_prologue.lua,
-- fence rule, own_keep.lua, semaphore.lua and semaphore_scan.lua first). Writes nothing.
--
-- KEYS[1] the semaphore key. ARGV[1] expiry grace (unused; every script's last ARGV).
--
-- Replies: {stored limit or 0 when none is stored, live permits}.
#!lua flags=no-writes
local s = sem_read(KEYS[1])
local live = 0
for _, p in ipairs(s.permits) do
  if p.live then live = live + 1 end
end
return {s.limit or 0, live}
