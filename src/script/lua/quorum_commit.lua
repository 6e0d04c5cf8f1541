-- quorum_commit: the quorum lock's second round. Raise this node's stored fence to the token T
-- the client chose (the highest fence the granting nodes answered in round one), but only while
-- this owner still holds the lock here and the stored fence is not above T (lock prologue
-- first). Idempotent: committing T again changes nothing.
--
-- KEYS[1] lock key. ARGV[1] owner token, ARGV[2] T (decimal, below 2^53), ARGV[3] expiry grace.
--
-- Replies: 1 committed (the stored fence is now T, and the key expires at max(lease end,
-- ceil(T / 1000)) + grace); 0 this owner holds no live lease here, or the stored fence is
-- above T (nothing written: this node granted a higher fence since the client's round one, e.g.
-- a resent acquire after another holder came and went; tests/quorum_model.rs shows T could
-- then duplicate that holder's token); an error reply (no write) when T is not a number. Not allow-oom (it may grow the
-- stored number).
#!lua
local fence = tonumber(ARGV[2])
if not fence then
  return redis.error_reply('ERR fencelock: quorum_commit needs a decimal fence, got ' .. tostring(ARGV[2]))
end
if not live or owner ~= ARGV[1] then return 0 end
local stored = tonumber(lock[3]) or 0
if stored > fence then return 0 end
lock[3] = fence
store(KEYS[1], lock)
-- T is a clock-mode fence (the quorum's rule): the key must outlive it read as server time, as
-- after a grant (`keep` does so only when the fence rule ran, which sets the shift).
memo.shift = 0
keep(KEYS[1], fence, expires)
return 1
