#!/usr/bin/env bash
# Issue 11: the server's work per acquire + release pair, counted in instructions (deterministic,
# unlike CPU time on a shared machine): fencelock's scripts, alone and batched, against rslock's
# `SET NX PX` + unlock script and against the bare commands fencelock's scripts run. Starts one
# redis-server under valgrind's callgrind on PORT (default 7930), sends each workload with
# `redis-cli --pipe` (N pairs on fresh names: N acquires, then N releases of the same names),
# prints instructions per pair, and stops the server by pid on exit.
#   PORT=7930 PAIRS=2000 scripts/bench-server-cost.sh
# Results: docs/benchmarks.md, "What one grant costs the server".
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

CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --quiet --release --bin fencelock
fencelock=target/release/fencelock

valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" \
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  >"$dir/valgrind.log" 2>&1 &
pid=$!
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
cli() { redis-cli -p "$port" "$@"; }

# Instructions the server ran (its main thread) since the counters were last zeroed.
instructions() {
  callgrind_control -e Ir "$pid" 2>/dev/null | awk '$1 == "Th" && $2 == "1" { gsub(",", "", $3); print $3 }'
}
# measure LABEL FILE: sends FILE's commands (RESP) through redis-cli --pipe on an empty
# database, prints instructions per pair.
measure() {
  cli flushall >/dev/null
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
owner=0123456789abcdef0123456789abcdef
ttl=10000
grace=10000
later=$(( $(date +%s) * 1000 + 3600000 ))

# rslock 0.10: SET key owner NX PX ttl, then its unlock script.
{
  for ((i = 0; i < n; i++)); do resp SET "{r$i}:lock" "$owner" NX PX "$ttl"; done
  for ((i = 0; i < n; i++)); do resp EVALSHA "$unlock" 1 "{r$i}:lock" "$owner"; done
} >"$dir/rslock"
# fencelock, one script call per acquire and per release (clock mode, as on a standalone server).
{
  for ((i = 0; i < n; i++)); do resp EVALSHA "$acquire" 1 "fencelock:{f$i}:lock" "$owner" "$ttl" 0 clock "$grace"; done
  for ((i = 0; i < n; i++)); do resp EVALSHA "$release" 1 "fencelock:{f$i}:lock" "$owner" "" "" "$grace"; done
} >"$dir/single"
# fencelock batched as the client does under load: 16 calls per script call.
{
  for ((i = 0; i < n; i += 16)); do
    args=()
    for ((j = i; j < i + 16; j++)); do args+=("fencelock:{f$j}:lock" 5 "$owner" "$ttl" 0 clock "$grace"); done
    resp EVALSHA "$acquire_batch" 1 "fencelock:{f$i}:lock" "${args[@]}"
  done
  for ((i = 0; i < n; i += 16)); do
    args=()
    for ((j = i; j < i + 16; j++)); do args+=("fencelock:{f$j}:lock" 4 "$owner" "" "" "$grace"); done
    resp EVALSHA "$release_batch" 1 "fencelock:{f$i}:lock" "${args[@]}"
  done
} >"$dir/batched"
# The same commands as fencelock's scripts with nothing else around them (no time, fence rule,
# lease or expiry logic): what any one-script-per-operation hash lock pays at least.
{
  for ((i = 0; i < n; i++)); do resp EVALSHA "$bare_acquire" 1 "{b$i}:lock" "$owner" "$later" "$((later * 1000 + i))" "$later"; done
  for ((i = 0; i < n; i++)); do resp EVALSHA "$bare_release" 1 "{b$i}:lock" "$owner"; done
} >"$dir/bare"

echo "redis $(redis-server --version | grep -o 'v=[0-9.]*'), callgrind, $n pairs per line"
measure rslock "$dir/rslock"
measure fencelock-single "$dir/single"
measure fencelock-batched-16 "$dir/batched"
measure bare-hash-commands "$dir/bare"
