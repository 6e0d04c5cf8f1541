#!/usr/bin/env bash
# The issue-4 benchmarks on a local 3-master/3-replica cluster this script starts (ports
# 7400-7405) and stops: handoff latency (wake-ups vs polling), 10 contenders through
# `fencelock exec`, uncontended throughput vs redis-benchmark running the same scripts at the
# same concurrency, the semaphore and the read-write lock (90% readers) against the mutex, and
# the watchdog's cost for 10,000 held locks. Results: docs/benchmarks.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
ensure_redis
base=${BASE_PORT:-7400}
url=redis://127.0.0.1:$base
scripts/cluster.sh up --base-port "$base" >/dev/null
trap 'scripts/cluster.sh down --base-port "$base" >/dev/null' EXIT
cargo build --quiet --release --bin fencelock --example bench
bench=target/release/examples/bench
fencelock=target/release/fencelock
echo "redis $(redis-server --version | grep -o 'v=[0-9.]*'), $(nproc) cores"

echo "== handoff: release -> next waiter holds the lock (4 clients, one lock)"
$bench --url "$url" handoff --handoffs "${HANDOFFS:-2000}" --hold-ms 5

echo "== fair handoff: release -> head of the queue holds the fair lock (4 clients, one lock)"
$bench --url "$url" fair-handoff --handoffs "${HANDOFFS:-2000}" --hold-ms 5

echo "== 10 contenders x 0.3 s through fencelock exec (target <= 3.45 s)"
start=$(date +%s.%N)
pids=()
for _ in $(seq 10); do
  $fencelock --url "$url" exec --ttl 10s --timeout 30s bench:exec -- sleep 0.3 & pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
end=$(date +%s.%N)
echo "exec contenders=10 hold=0.3s total=$(echo "$end - $start" | bc)s"

echo "== uncontended acquire+release, 64 concurrent (same scripts, same concurrency)"
seconds=${SECONDS_PER_RUN:-10}
$bench --url "$url" throughput --tasks 64 --seconds "$seconds"
acquire=$($fencelock script acquire) release=$($fencelock script release)
for port in $(seq "$base" $((base + 5))); do
  redis-cli -p "$port" script load "$acquire" >/dev/null
  redis-cli -p "$port" script load "$release" >/dev/null
done
a=$(redis-cli -p "$base" script load "$acquire")
r=$(redis-cli -p "$base" script load "$release")
# 32 clients acquire and 32 release the same key space (owner o) at once: grants, replays,
# releases and no-ops in about the mix a holder produces. redis-benchmark pins each key's hash
# tag to a slot of the node it sends to ({tag}).
requests=$((seconds * 25000))
run() { redis-benchmark --cluster -p "$base" -c 32 -n "$requests" -r 100000 --csv "$@" | tail -1 | cut -d, -f2 | tr -d '"'; }
run EVALSHA "$a" 1 "bench:{tag}:__rand_int__:lock" o 10000 0 clock 10000 > /tmp/fencelock-bench-a &
run EVALSHA "$r" 1 "bench:{tag}:__rand_int__:lock" o "" s 10000 > /tmp/fencelock-bench-r &
wait
ra=$(cat /tmp/fencelock-bench-a) rr=$(cat /tmp/fencelock-bench-r)
echo "redis-benchmark acquire=${ra} calls/s release=${rr} calls/s total=$(echo "$ra + $rr" | bc) calls/s (64 clients)"
rm -f /tmp/fencelock-bench-a /tmp/fencelock-bench-r

echo "== semaphore (limit 64, 64 tasks, one key) vs the mutex uncontended, same run"
$bench --url "$url" semaphore --tasks 64 --limit 64 --seconds "$seconds"

echo "== read-write lock, 90% readers (64 tasks, 4 clients, one name) vs the mutex (all exclusive), same run"
$bench --url "$url" rwlock --tasks 64 --clients 4 --read-percent 90 --hold-ms 0,1 --seconds "$seconds"

echo "== watchdog: 10,000 held locks"
$bench --url "$url" renewal --locks 10000 --ttl-ms 3000 --periods 5
