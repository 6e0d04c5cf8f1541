#!/usr/bin/env bash
# Issue 11: the server's work per acquire + release pair, counted in instructions (deterministic,
# unlike CPU time on a shared machine): fencelock's scripts, alone and batched, against rslock's
# `SET NX PX` + unlock script and against the bare commands fencelock's scripts run. Starts one
# redis-server under valgrind's callgrind on PORT (default 7930), sends each workload with
# `redis-cli --pipe` (N pairs on fresh names: N acquires, then N releases of the same names),
# prints instructions per pair, and stops the server by pid on exit. Issue 22: a line each for
# the read-write lock's read and write holds, the semaphore (limit 8 on fresh names; limit 256
# with 200 permits held by others, one acquire + release after another on the same key) and the
# latch's count-down (latches of count 8; a "pair" is one count-down), sent as the client sends
# them on a standalone server (announce `p`). Issue 25: mutex-handoff-Q-queued, a hot lock's
# server work per grant with Q waiters queued (a release that grants the head, and the
# releaser's acquire that queues it again); fair-lock, the fair lock's uncontended pair, and
# fair-handoff-Q-queued, its handoff as mutex-handoff-Q-queued; mutex-in-client-handoff, a
# handoff call (handoff.lua: release A, grant B of the same client, 16 fences reserved) on a
# lock nobody else waits for, and mutex-cohort-handoff-8-queued, the same call with `c` (a
# cohort's handoff ahead of 8 queued places of other clients). Issue 22
# item 3: the default fence mode
# (epoch-clock, `hybrid` in the scripts) reads `CLUSTER INFO` only on a cluster, so the last
# lines restart the server in cluster mode (one node serving every slot, on PORT + 1) and measure
# the mutex pair in that mode, and what the epoch read and the cheaper reads considered for it
# cost inside a script (one call per "pair": TIME alone, TIME + CLUSTER INFO, TIME + INFO
# replication, TIME + INFO replication + a plain find of `master_replid:<id>`). Issue 22 item 1,
# FCALL against EVALSHA: fencelock-fcall-single and fencelock-fcall-batched-16 send the same
# pairs as fencelock-single and fencelock-batched-16 through FCALL of the same four scripts
# loaded as Redis 7 functions (bodies unchanged), and entry-* the cost of entering a script
# (`return 1`, one key, six arguments) by EVALSHA and by FCALL. Semaphore extend and renew: N
# semaphores of 8 permits on fresh names, one permit of each held for an hour (setup, not
# counted); a "pair" is one extend of it (semaphore-extend), or one entry of the watchdog's renew
# call as it sends it for one-permit holds (semaphore-renew: 100 holds per call, each weighing 2
# of its 200; semaphore-renew-alone: a call for one hold).
#   PORT=7930 PAIRS=2000 scripts/bench-server-cost.sh
#   FENCELOCK=/path/to/an/older/fencelock scripts/bench-server-cost.sh   (that build's scripts)
#   MODULE=/path/to/libfencelock_module.so scripts/bench-server-cost.sh   (issue 24: the module
#     loaded, and the lines fencelock-module and fencelock-module-batched-16: the pairs of
#     fencelock-single and fencelock-batched-16 sent as the module's commands, and
#     module-handoff-Q-queued and module-fair-handoff-Q-queued: mutex-handoff-Q-queued and
#     fair-handoff-Q-queued as the module's commands; MODULE_ARGS="release-deletes yes" passes
#     the module its load arguments: docs/module.md)
# Issue 22's floor: calls-only-hash-single / -batched-16 run the calls of the mutex pair as the
# scripts make them on fresh names (acquire: TIME, HGET, HEXISTS, HSET, PEXPIREAT; release: TIME,
# HGET, HSET) with nothing else around them but the two numbers formatted, one script call per
# operation and 16 per call as acquire_batch/release_batch wrap them; calls-only-string-* the same
# with the state as a string value (acquire: TIME, GET, SET ... PXAT; release: TIME, GET,
# SET ... KEEPTTL), the layout issue 22 suggests.
# Results: docs/benchmarks.md, "What one grant costs the server" and "FCALL against EVALSHA".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
ensure_redis
if ! command -v valgrind >/dev/null || ! command -v callgrind_control >/dev/null; then
  echo "installing valgrind with apt-get" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null
fi
port=${PORT:-7930}
n=${PAIRS:-2000}
dir=$(mktemp -d)
pid=

stop() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fi
  rm -rf "$dir"
}
trap stop EXIT

# FENCELOCK=path: take the scripts from that build of the CLI (e.g. one of an older commit, for a
# before/after table) instead of building this tree's.
fencelock=${FENCELOCK:-}
if [ -z "$fencelock" ]; then
  CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --quiet --release --bin fencelock
  fencelock=${CARGO_TARGET_DIR:-target}/release/fencelock
fi

module=${MODULE:-}
load_module=()
if [ -n "$module" ]; then
  load_module=(--loadmodule "$(module_path "$module")")
  # shellcheck disable=SC2206
  load_module+=(${MODULE_ARGS:-})
fi
valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" \
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  "${load_module[@]}" >"$dir/valgrind.log" 2>&1 &
pid=$!
until redis-cli -p "$port" ping >/dev/null 2>&1; do
  # A server that exits (a module that fails to load) would leave this loop waiting for good.
  if ! kill -0 "$pid" 2>/dev/null; then cat "$dir/valgrind.log" >&2; pid=; exit 1; fi
  sleep 0.2
done
cli() { redis-cli -p "$port" "$@"; }

# Instructions the server ran (its main thread) since the counters were last zeroed.
instructions() {
  callgrind_control -e Ir "$pid" 2>/dev/null | awk '$1 == "Th" && $2 == "1" { gsub(",", "", $3); print $3 }'
}
# measure LABEL FILE [SETUP]: sends FILE's commands (RESP) through redis-cli --pipe on an empty
# database (after SETUP's, which are not counted), prints instructions per pair.
measure() {
  cli flushall >/dev/null
  if [ -n "${3:-}" ]; then redis-cli -p "$port" --pipe <"$3" >/dev/null; fi
  callgrind_control -z "$pid" >/dev/null 2>&1
  redis-cli -p "$port" --pipe <"$2" >/dev/null
  local ir
  ir=$(instructions)
  echo "server-cost $1 pairs=$n instructions/pair=$((ir / n))"
}
# resp ARG...: one command in RESP.
resp() {
  printf '*%d\r\n' "$#"
  local arg
  for arg in "$@"; do printf '$%d\r\n%s\r\n' "${#arg}" "$arg"; done
}

acquire=$(cli script load "$($fencelock script acquire)")
release=$(cli script load "$($fencelock script release)")
acquire_batch=$(cli script load "$($fencelock script acquire_batch)")
release_batch=$(cli script load "$($fencelock script release_batch)")
unlock=$(cli script load 'if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end')
bare_acquire=$(cli script load "local l = redis.call('HMGET', KEYS[1], 'owner', 'until', 'fence', 'holds', 'waiters')
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'until', ARGV[2], 'fence', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], ARGV[4]) return {1, ARGV[3], 0}")
bare_release=$(cli script load "local l = redis.call('HMGET', KEYS[1], 'owner', 'until', 'fence', 'holds', 'waiters')
if l[1] ~= ARGV[1] then return 0 end redis.call('HDEL', KEYS[1], 'owner', 'until', 'waiters') return 1")
# Issue 22's floor (see the top): the calls of the mutex pair with no logic, alone and batched.
clock_now="local now = redis.call('TIME') local us = now[1] * 1000000 + now[2] local ms = (us - us % 1000) / 1000"
calls_hash_acquire="local s = redis.call('HGET', K, 'until') if not s then local x = redis.call('HEXISTS', K, 'fence') end
redis.call('HSET', K, 'until', string.format('%d %d %s', ms + A[2], us, A[1]))
redis.call('PEXPIREAT', K, string.format('%d', ms + A[2] + A[5])) return 1"
calls_hash_release="local s = redis.call('HGET', K, 'until') redis.call('HSET', K, 'until', '0 1764000000000123 ') return 1"
calls_string_acquire="local s = redis.call('GET', K)
redis.call('SET', K, string.format('%d %d %s', ms + A[2], us, A[1]), 'PXAT', string.format('%d', ms + A[2] + A[5])) return 1"
calls_string_release="local s = redis.call('GET', K) redis.call('SET', K, '0 1764000000000123 ', 'KEEPTTL') return 1"
calls_single() { cli script load "local K, A = KEYS[1], ARGV $clock_now
$1"; }
calls_batched() { cli script load "local batch = ARGV $clock_now
local function op(K, A) $1 end
local replies, i = {}, 1
while i <= #batch do
  local n = tonumber(batch[i + 1])
  local ok, reply = pcall(op, batch[i], {unpack(batch, i + 2, i + 1 + n)})
  replies[#replies + 1] = reply
  i = i + 2 + n
end
return replies"; }
for layout in hash string; do
  acquire_body=calls_${layout}_acquire release_body=calls_${layout}_release
  printf -v "calls_${layout}_single_acquire" %s "$(calls_single "${!acquire_body}")"
  printf -v "calls_${layout}_single_release" %s "$(calls_single "${!release_body}")"
  printf -v "calls_${layout}_batched_acquire" %s "$(calls_batched "${!acquire_body}")"
  printf -v "calls_${layout}_batched_release" %s "$(calls_batched "${!release_body}")"
done
rw_read=$(cli script load "$($fencelock script rw_read)")
rw_write=$(cli script load "$($fencelock script rw_write)")
rw_release=$(cli script load "$($fencelock script rw_release)")
sem_acquire=$(cli script load "$($fencelock script semaphore_acquire)")
sem_release=$(cli script load "$($fencelock script semaphore_release)")
sem_extend=$(cli script load "$($fencelock script semaphore_extend)")
sem_renew=$(cli script load "$($fencelock script semaphore_renew)")
latch_set=$(cli script load "$($fencelock script latch_set)")
latch_count_down=$(cli script load "$($fencelock script latch_count_down)")
handoff=$(cli script load "$($fencelock script handoff)")
fair_acquire=$(cli script load "$($fencelock script fair_acquire)")
fair_release=$(cli script load "$($fencelock script fair_release)")
# The same four mutex scripts as Redis 7 functions (issue 22 item 1, FCALL against EVALSHA): each
# body runs unchanged inside its function (the `#!lua` line's flags become the function's; `KEYS`
# and `ARGV` are locals bound to the function's arguments, so `memo` and the prologue still run
# once per call), all in one library loaded with FUNCTION LOAD.
as_function() {
  local flags=
  if [[ $2 == '#!lua'* ]]; then
    flags=$(sed -n '1s/^#!lua.*flags=\([^ ]*\).*/\1/p' <<<"$2" | sed "s/[^,][^,]*/'&'/g; s/,/, /g")
  fi
  printf "redis.register_function{function_name = '%s', flags = {%s}, callback = function(keys, args)\n" "$1" "$flags"
  printf 'local KEYS, ARGV = keys, args\n'
  if [[ $2 == '#!lua'* ]]; then sed 1d <<<"$2"; else printf '%s\n' "$2"; fi
  printf 'end}\n'
}
library=$(
  printf '#!lua name=fencelock_bench\n'
  for name in acquire release acquire_batch release_batch; do as_function "fl_$name" "$($fencelock script "$name")"; done
  as_function fl_entry 'return 1'
)
loaded=$(cli function load replace "$library")
if [ "$loaded" != fencelock_bench ]; then echo "FUNCTION LOAD failed: $loaded" >&2; exit 1; fi
# Entering a script: `return 1` with one key and six arguments, by EVALSHA (plain, and with the
# `#!lua` line every fencelock script starts with) and by FCALL.
entry=$(cli script load 'return 1')
entry_shebang=$(cli script load '#!lua
return 1')
owner=0123456789abcdef0123456789abcdef
ttl=10000
grace=10000
later=$(( $(date +%s) * 1000 + 3600000 ))

# rslock 0.10: SET key owner NX PX ttl, then its unlock script.
{
  for ((i = 0; i < n; i++)); do resp SET "{r$i}:lock" "$owner" NX PX "$ttl"; done
  for ((i = 0; i < n; i++)); do resp EVALSHA "$unlock" 1 "{r$i}:lock" "$owner"; done
} >"$dir/rslock"
# single_pairs ACQUIRE RELEASE: the mutex pairs on fresh names, one EVALSHA of the scripts with
# those SHAs per acquire and per release (clock mode, as on a standalone server).
single_pairs() {
  for ((i = 0; i < n; i++)); do resp EVALSHA "$1" 1 "fencelock:{f$i}:lock" "$owner" "$ttl" 0 clock "$grace"; done
  for ((i = 0; i < n; i++)); do resp EVALSHA "$2" 1 "fencelock:{f$i}:lock" "$owner" "" "" "$grace"; done
}
# batched_pairs ACQUIRE RELEASE: the same pairs batched as the client does under load, 16 calls
# per EVALSHA of the batch scripts with those SHAs.
batched_pairs() {
  for ((i = 0; i < n; i += 16)); do
    args=()
    for ((j = i; j < i + 16; j++)); do args+=("fencelock:{f$j}:lock" 5 "$owner" "$ttl" 0 clock "$grace"); done
    resp EVALSHA "$1" 1 "fencelock:{f$i}:lock" "${args[@]}"
  done
  for ((i = 0; i < n; i += 16)); do
    args=()
    for ((j = i; j < i + 16; j++)); do args+=("fencelock:{f$j}:lock" 4 "$owner" "" "" "$grace"); done
    resp EVALSHA "$2" 1 "fencelock:{f$i}:lock" "${args[@]}"
  done
}
single_pairs "$acquire" "$release" >"$dir/single"
batched_pairs "$acquire_batch" "$release_batch" >"$dir/batched"
# The same commands as fencelock's scripts with nothing else around them (no time, fence rule,
# lease or expiry logic): what any one-script-per-operation hash lock pays at least.
{
  for ((i = 0; i < n; i++)); do resp EVALSHA "$bare_acquire" 1 "{b$i}:lock" "$owner" "$later" "$((later * 1000 + i))" "$later"; done
  for ((i = 0; i < n; i++)); do resp EVALSHA "$bare_release" 1 "{b$i}:lock" "$owner"; done
} >"$dir/bare"
# Issue 22's floor: the same pairs' calls with no logic, alone and batched 16 per call.
for layout in hash string; do
  acquire_sha=calls_${layout}_single_acquire release_sha=calls_${layout}_single_release
  single_pairs "${!acquire_sha}" "${!release_sha}" >"$dir/calls_${layout}_single"
  acquire_sha=calls_${layout}_batched_acquire release_sha=calls_${layout}_batched_release
  batched_pairs "${!acquire_sha}" "${!release_sha}" >"$dir/calls_${layout}_batched"
done
# The same pairs through the module's commands (MODULE set).
if [ -n "$module" ]; then
  {
    for ((i = 0; i < n; i++)); do resp fencelock.acquire "fencelock:{f$i}:lock" "$owner" "$ttl" 0 clock "$grace"; done
    for ((i = 0; i < n; i++)); do resp fencelock.release "fencelock:{f$i}:lock" "$owner" "" "" "$grace"; done
  } >"$dir/module_single"
  # The same pairs as fencelock-batched-16 through the module's batched commands, as the client
  # sends them: 16 acquires per fencelock.acquire_packed (each item its key, then owner, TTL,
  # floor, mode, place 0 (none) and grace joined by spaces), then 16 releases per
  # fencelock.release_packed (owner, no hold id, no announcement, grace).
  {
    for ((i = 0; i < n; i += 16)); do
      args=()
      for ((j = i; j < i + 16; j++)); do args+=("fencelock:{f$j}:lock" "$owner $ttl 0 clock 0 $grace"); done
      resp fencelock.acquire_packed "${args[@]}"
    done
    for ((i = 0; i < n; i += 16)); do
      args=()
      for ((j = i; j < i + 16; j++)); do args+=("fencelock:{f$j}:lock" "$owner   $grace"); done
      resp fencelock.release_packed "${args[@]}"
    done
  } >"$dir/module_batched"
fi
# The same pairs through FCALL, same names and arguments.
{
  for ((i = 0; i < n; i++)); do resp FCALL fl_acquire 1 "fencelock:{f$i}:lock" "$owner" "$ttl" 0 clock "$grace"; done
  for ((i = 0; i < n; i++)); do resp FCALL fl_release 1 "fencelock:{f$i}:lock" "$owner" "" "" "$grace"; done
} >"$dir/fcall_single"
{
  for ((i = 0; i < n; i += 16)); do
    args=()
    for ((j = i; j < i + 16; j++)); do args+=("fencelock:{f$j}:lock" 5 "$owner" "$ttl" 0 clock "$grace"); done
    resp FCALL fl_acquire_batch 1 "fencelock:{f$i}:lock" "${args[@]}"
  done
  for ((i = 0; i < n; i += 16)); do
    args=()
    for ((j = i; j < i + 16; j++)); do args+=("fencelock:{f$j}:lock" 4 "$owner" "" "" "$grace"); done
    resp FCALL fl_release_batch 1 "fencelock:{f$i}:lock" "${args[@]}"
  done
} >"$dir/fcall_batched"
# One script entry per "pair".
for ((i = 0; i < n; i++)); do resp EVALSHA "$entry" 1 "{e$i}:k" a b c d e f; done >"$dir/entry_evalsha"
for ((i = 0; i < n; i++)); do resp EVALSHA "$entry_shebang" 1 "{e$i}:k" a b c d e f; done >"$dir/entry_evalsha_shebang"
for ((i = 0; i < n; i++)); do resp FCALL fl_entry 1 "{e$i}:k" a b c d e f; done >"$dir/entry_fcall"

# The read-write lock: read holds, then write holds (a waiting call's intent id), on fresh names.
{
  for ((i = 0; i < n; i++)); do resp EVALSHA "$rw_read" 1 "fencelock:{w$i}:rw" "$owner" "$ttl" 0 clock 256 "$grace"; done
  for ((i = 0; i < n; i++)); do resp EVALSHA "$rw_release" 1 "fencelock:{w$i}:rw" "$owner" "" p "$grace"; done
} >"$dir/rw_read"
{
  for ((i = 0; i < n; i++)); do resp EVALSHA "$rw_write" 1 "fencelock:{w$i}:rw" "$owner" "$ttl" 0 clock "w$owner" "$grace"; done
  for ((i = 0; i < n; i++)); do resp EVALSHA "$rw_release" 1 "fencelock:{w$i}:rw" "$owner" "" p "$grace"; done
} >"$dir/rw_write"
# The semaphore, one permit per acquire: limit 8 on fresh names (permit 0 each) ...
{
  for ((i = 0; i < n; i++)); do resp EVALSHA "$sem_acquire" 1 "fencelock:{s$i}:sem" "$owner" 1 8 "$ttl" 0 clock "" "$grace"; done
  for ((i = 0; i < n; i++)); do resp EVALSHA "$sem_release" 1 "fencelock:{s$i}:sem" "$owner" 0 p "$grace"; done
} >"$dir/sem8"
# ... and limit 256 with permits 0..199 held by other owners for an hour (not counted): each
# pair takes permit 200 and gives it back.
{
  for ((i = 0; i < 200; i++)); do resp EVALSHA "$sem_acquire" 1 "fencelock:{s}:sem" "$(printf 'held%028d' "$i")" 1 256 3600000 0 clock "" "$grace"; done
} >"$dir/sem256_setup"
{
  for ((i = 0; i < n; i++)); do
    resp EVALSHA "$sem_acquire" 1 "fencelock:{s}:sem" "$(printf 'pair%028d' "$i")" 1 256 "$ttl" 0 clock "" "$grace"
    resp EVALSHA "$sem_release" 1 "fencelock:{s}:sem" "$(printf 'pair%028d' "$i")" 200 p "$grace"
  done
} >"$dir/sem256"
# Extend and renew: permit 0 of N semaphores of limit 8 held for an hour (not counted), each
# extended once, or renewed once by the watchdog's call (100 one-permit holds per call, or one).
{
  for ((i = 0; i < n; i++)); do resp EVALSHA "$sem_acquire" 1 "fencelock:{x$i}:sem" "$owner" 1 8 3600000 0 clock "" "$grace"; done
} >"$dir/sem_hold_setup"
for ((i = 0; i < n; i++)); do resp EVALSHA "$sem_extend" 1 "fencelock:{x$i}:sem" "$owner 0" "$ttl" "$grace"; done >"$dir/sem_extend"
for per in 100 1; do
  for ((i = 0; i < n; i += per)); do
    args=()
    for ((j = i; j < i + per && j < n; j++)); do args+=("fencelock:{x$j}:sem" "$owner 0" "$ttl"); done
    resp EVALSHA "$sem_renew" 1 "fencelock:{x$i}:sem" "${args[@]}" "$grace"
  done >"$dir/sem_renew$per"
done
# The latch: N / 8 latches of count 8 (set, not counted), each counted down by 8 ids; the last
# count-down of each opens it.
{
  for ((i = 0; i < n; i += 8)); do resp EVALSHA "$latch_set" 1 "fencelock:{l$i}:latch" 8 "set$i" 0 clock p 60000 "$grace"; done
} >"$dir/latch_setup"
{
  for ((i = 0; i < n; i += 8)); do
    for ((j = 0; j < 8; j++)); do resp EVALSHA "$latch_count_down" 1 "fencelock:{l$i}:latch" "id$j" "" p 60000 "$grace"; done
  done
} >"$dir/latch"

# The fair lock, uncontended (issue 22 item 2): fair_acquire as a waiting `fair_lock` call sends
# it (place lease 30 s, the queue's cap 128), then fair_release, on fresh names.
{
  for ((i = 0; i < n; i++)); do resp EVALSHA "$fair_acquire" 1 "fencelock:{q$i}:fair" "$owner" "$ttl" 0 clock 30000 128 "$grace"; done
  for ((i = 0; i < n; i++)); do resp EVALSHA "$fair_release" 1 "fencelock:{q$i}:fair" "$owner" "" p "$grace"; done
} >"$dir/fair"

# A hot lock's handoff (issue 25): one lock, Q waiters queued (place lease 10 min, so their
# places stay fresh under callgrind's slowdown), each "pair" one release that grants the head on
# the server and announces it, and one acquire by the releaser that queues it again at the tail:
# the server's scripts per grant in the hot-lock benchmark (scripts/bench-hot-lock.sh).
# Owners hot0..hotQ: hot0 holds, hot1..hotQ queued (setup, not counted); step i's holder is
# i mod (Q + 1).
hot_owner() { printf 'hot%029d' "$1"; }
for q in 8 32; do
  {
    resp EVALSHA "$acquire" 1 "fencelock:{hot$q}:lock" "$(hot_owner 0)" "$ttl" 0 clock "$grace"
    for ((k = 1; k <= q; k++)); do
      resp EVALSHA "$acquire" 1 "fencelock:{hot$q}:lock" "$(hot_owner "$k")" "$ttl" 0 clock 600000 "$grace"
    done
  } >"$dir/hot${q}_setup"
  for ((i = 0; i < n; i++)); do
    o=$(hot_owner $((i % (q + 1))))
    resp EVALSHA "$release" 1 "fencelock:{hot$q}:lock" "$o" "" p "$grace"
    resp EVALSHA "$acquire" 1 "fencelock:{hot$q}:lock" "$o" "$ttl" 0 clock 600000 "$grace"
  done >"$dir/hot$q"
done

# Handoffs within a client (issue 25): each "pair" is one handoff call from the holder to the
# next owner of the same client (same first 8 characters), taking 16 fences: on a lock nobody
# else waits for, and as a cohort's (`c`) ahead of 8 places of another client (setup: the first
# owner holds, the 8 queue; not counted).
cohort_owner() { printf 'cohorttt%024d' "$1"; }
{
  resp EVALSHA "$acquire" 1 "fencelock:{inclient}:lock" "$(cohort_owner 0)" "$ttl" 0 clock "$grace"
} >"$dir/inclient_setup"
{
  resp EVALSHA "$acquire" 1 "fencelock:{cohort8}:lock" "$(cohort_owner 0)" "$ttl" 0 clock "$grace"
  for ((k = 1; k <= 8; k++)); do
    resp EVALSHA "$acquire" 1 "fencelock:{cohort8}:lock" "$(hot_owner "$k")" "$ttl" 0 clock 600000 "$grace"
  done
} >"$dir/cohort8_setup"
for ((i = 0; i < n; i++)); do
  resp EVALSHA "$handoff" 1 "fencelock:{inclient}:lock" "$(cohort_owner "$i")" "" p \
    "$(cohort_owner $((i + 1)))" "$ttl" 0 clock 20 16 "" "$grace"
done >"$dir/inclient"
for ((i = 0; i < n; i++)); do
  resp EVALSHA "$handoff" 1 "fencelock:{cohort8}:lock" "$(cohort_owner "$i")" "" p \
    "$(cohort_owner $((i + 1)))" "$ttl" 0 clock 20 16 c "$grace"
done >"$dir/cohort8"

# The same handoff through the module's commands (MODULE set): the release that grants the head
# is fencelock.release, the acquire that queues the releaser again fencelock.acquire.
if [ -n "$module" ]; then
  for q in 8 32; do
    {
      resp fencelock.acquire "fencelock:{mhot$q}:lock" "$(hot_owner 0)" "$ttl" 0 clock "$grace"
      for ((k = 1; k <= q; k++)); do
        resp fencelock.acquire "fencelock:{mhot$q}:lock" "$(hot_owner "$k")" "$ttl" 0 clock 600000 "$grace"
      done
    } >"$dir/mhot${q}_setup"
    for ((i = 0; i < n; i++)); do
      o=$(hot_owner $((i % (q + 1))))
      resp fencelock.release "fencelock:{mhot$q}:lock" "$o" "" p "$grace"
      resp fencelock.acquire "fencelock:{mhot$q}:lock" "$o" "$ttl" 0 clock 600000 "$grace"
    done >"$dir/mhot$q"
  done
  # The fair lock's handoff through the module: fencelock.fair_release and fencelock.fair_acquire.
  for q in 8 32; do
    {
      resp fencelock.fair_acquire "fencelock:{mfhot$q}:fair" "$(hot_owner 0)" "$ttl" 0 clock 0 128 "$grace"
      for ((k = 1; k <= q; k++)); do
        resp fencelock.fair_acquire "fencelock:{mfhot$q}:fair" "$(hot_owner "$k")" "$ttl" 0 clock 600000 128 "$grace"
      done
    } >"$dir/mfhot${q}_setup"
    for ((i = 0; i < n; i++)); do
      o=$(hot_owner $((i % (q + 1))))
      resp fencelock.fair_release "fencelock:{mfhot$q}:fair" "$o" "" p "$grace"
      resp fencelock.fair_acquire "fencelock:{mfhot$q}:fair" "$o" "$ttl" 0 clock 600000 128 "$grace"
    done >"$dir/mfhot$q"
  done
fi

# The fair lock's handoff under the same load: Q waiters queued, each "pair" one fair_release
# that grants the head on the server and announces it, and one fair_acquire by the releaser that
# queues it again (the queue's cap 128).
for q in 8 32; do
  {
    resp EVALSHA "$fair_acquire" 1 "fencelock:{fhot$q}:fair" "$(hot_owner 0)" "$ttl" 0 clock 0 128 "$grace"
    for ((k = 1; k <= q; k++)); do
      resp EVALSHA "$fair_acquire" 1 "fencelock:{fhot$q}:fair" "$(hot_owner "$k")" "$ttl" 0 clock 600000 128 "$grace"
    done
  } >"$dir/fhot${q}_setup"
  for ((i = 0; i < n; i++)); do
    o=$(hot_owner $((i % (q + 1))))
    resp EVALSHA "$fair_release" 1 "fencelock:{fhot$q}:fair" "$o" "" p "$grace"
    resp EVALSHA "$fair_acquire" 1 "fencelock:{fhot$q}:fair" "$o" "$ttl" 0 clock 600000 128 "$grace"
  done >"$dir/fhot$q"
done

echo "redis $(redis-server --version | grep -o 'v=[0-9.]*'), callgrind, $n pairs per line"
measure rslock "$dir/rslock"
measure fencelock-single "$dir/single"
measure fencelock-batched-16 "$dir/batched"
measure bare-hash-commands "$dir/bare"
for layout in hash string; do
  measure "calls-only-$layout-single" "$dir/calls_${layout}_single"
  measure "calls-only-$layout-batched-16" "$dir/calls_${layout}_batched"
done
measure rw-read "$dir/rw_read"
measure rw-write "$dir/rw_write"
measure semaphore-limit-8 "$dir/sem8"
measure semaphore-limit-256-held-200 "$dir/sem256" "$dir/sem256_setup"
measure semaphore-extend "$dir/sem_extend" "$dir/sem_hold_setup"
measure semaphore-renew "$dir/sem_renew100" "$dir/sem_hold_setup"
measure semaphore-renew-alone "$dir/sem_renew1" "$dir/sem_hold_setup"
measure latch-count-down "$dir/latch" "$dir/latch_setup"
measure mutex-handoff-8-queued "$dir/hot8" "$dir/hot8_setup"
measure mutex-handoff-32-queued "$dir/hot32" "$dir/hot32_setup"
measure mutex-in-client-handoff "$dir/inclient" "$dir/inclient_setup"
measure mutex-cohort-handoff-8-queued "$dir/cohort8" "$dir/cohort8_setup"
measure fair-lock "$dir/fair"
measure fair-handoff-8-queued "$dir/fhot8" "$dir/fhot8_setup"
measure fair-handoff-32-queued "$dir/fhot32" "$dir/fhot32_setup"
measure fencelock-fcall-single "$dir/fcall_single"
measure fencelock-fcall-batched-16 "$dir/fcall_batched"
measure entry-evalsha "$dir/entry_evalsha"
measure entry-evalsha-shebang "$dir/entry_evalsha_shebang"
measure entry-fcall "$dir/entry_fcall"
if [ -n "$module" ]; then
  measure fencelock-module "$dir/module_single"
  measure fencelock-module-batched-16 "$dir/module_batched"
  measure module-handoff-8-queued "$dir/mhot8" "$dir/mhot8_setup"
  measure module-handoff-32-queued "$dir/mhot32" "$dir/mhot32_setup"
  measure module-fair-handoff-8-queued "$dir/mfhot8" "$dir/mfhot8_setup"
  measure module-fair-handoff-32-queued "$dir/mfhot32" "$dir/mfhot32_setup"
fi

# The default fence mode where it reads the epoch: a cluster-mode node serving every slot.
cluster_port=$((port + 1))
kill "$pid" 2>/dev/null || true
while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
rm -f "$dir/callgrind.out"*
valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" \
  redis-server --port "$cluster_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --cluster-enabled yes --cluster-config-file "$dir/nodes.conf" >"$dir/valgrind-cluster.log" 2>&1 &
pid=$!
port=$cluster_port
until redis-cli -p "$port" ping >/dev/null 2>&1; do
  if ! kill -0 "$pid" 2>/dev/null; then cat "$dir/valgrind-cluster.log" >&2; pid=; exit 1; fi
  sleep 0.2
done
cli cluster addslotsrange 0 16383 >/dev/null
# Under callgrind the node is slow: 60 s.
wait_for_cluster_ok "$port" "$dir/valgrind-cluster.log" 60
acquire=$(cli script load "$($fencelock script acquire)")
release=$(cli script load "$($fencelock script release)")
acquire_batch=$(cli script load "$($fencelock script acquire_batch)")
release_batch=$(cli script load "$($fencelock script release_batch)")
{
  for ((i = 0; i < n; i++)); do resp EVALSHA "$acquire" 1 "fencelock:{f$i}:lock" "$owner" "$ttl" 0 hybrid "$grace"; done
  for ((i = 0; i < n; i++)); do resp EVALSHA "$release" 1 "fencelock:{f$i}:lock" "$owner" "" "" "$grace"; done
} >"$dir/single_hybrid"
{
  for ((i = 0; i < n; i += 16)); do
    args=()
    for ((j = i; j < i + 16; j++)); do args+=("fencelock:{f$j}:lock" 5 "$owner" "$ttl" 0 hybrid "$grace"); done
    resp EVALSHA "$acquire_batch" 1 "fencelock:{f$i}:lock" "${args[@]}"
  done
  for ((i = 0; i < n; i += 16)); do
    args=()
    for ((j = i; j < i + 16; j++)); do args+=("fencelock:{f$j}:lock" 4 "$owner" "" "" "$grace"); done
    resp EVALSHA "$release_batch" 1 "fencelock:{f$i}:lock" "${args[@]}"
  done
} >"$dir/batched_hybrid"
replid=$(cli info replication | tr -d '\r' | sed -n 's/^master_replid://p')
read_time=$(cli script load "local t = redis.call('TIME') return 1")
read_cluster_info=$(cli script load "local t = redis.call('TIME') local i = redis.call('CLUSTER', 'INFO') return tonumber(string.match(i, 'cluster_my_epoch:(%d+)'))")
read_info_replication=$(cli script load "local t = redis.call('TIME') local i = redis.call('INFO', 'replication') return 1")
read_replid_find=$(cli script load "local t = redis.call('TIME') local i = redis.call('INFO', 'replication') if string.find(i, 'master_replid:' .. ARGV[1], 1, true) then return 1 end return 0")
for name in read_time read_cluster_info read_info_replication; do
  for ((i = 0; i < n; i++)); do resp EVALSHA "${!name}" 0; done >"$dir/$name"
done
for ((i = 0; i < n; i++)); do resp EVALSHA "$read_replid_find" 0 "$replid"; done >"$dir/read_replid_find"

echo "redis cluster mode (one node, every slot), fence mode epoch-clock; read-* lines: one script call per pair"
measure fencelock-single-epoch-clock-cluster "$dir/single_hybrid"
measure fencelock-batched-16-epoch-clock-cluster "$dir/batched_hybrid"
measure read-time "$dir/read_time"
measure read-cluster-info "$dir/read_cluster_info"
measure read-info-replication "$dir/read_info_replication"
measure read-info-replication-find-replid "$dir/read_replid_find"
