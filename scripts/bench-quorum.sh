#!/usr/bin/env bash
# Issue 12 measurements in ONE run: the fenced quorum lock against rslock's Redlock over 3 and
# over 5 local standalone servers, and the multi-lock of 2, 5 and 10 names spread over the three
# masters of a cluster. Starts 5 standalone servers on BASE_PORT..BASE_PORT+4 (default 7900) and
# a 3-master/3-replica cluster on BASE_PORT+10..BASE_PORT+15 (scripts/cluster.sh), builds
# release, runs examples/quorum_bench.rs, prints one `qbench ...` line per figure and `ratio ...`
# lines at the end, and stops what it started (by pid) on exit.
#   BASE_PORT=7900 SECONDS_PER_RUN=5 LATENCY_PAIRS=3000 scripts/bench-quorum.sh
# Results: docs/benchmarks.md, "Quorum lock and multi-lock (issue 12)".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
ensure_redis
base=${BASE_PORT:-7900}
seconds=${SECONDS_PER_RUN:-5}
pairs=${LATENCY_PAIRS:-3000}
cport=$((base + 10))
standalone=$(seq -s, -f "redis://127.0.0.1:%g" "$base" $((base + 4)))
cluster=$(seq -s, -f "redis://127.0.0.1:%g" "$cport" $((cport + 2)))
dir=$(mktemp -d)
out=$dir/lines

stop() {
  local pid port
  for port in $(seq "$base" $((base + 4))); do
    pid=$(cat "$dir/$port.pid" 2>/dev/null || true)
    if [ -n "$pid" ]; then
      kill "$pid" 2>/dev/null || true
      while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    fi
  done
  scripts/cluster.sh down --base-port "$cport" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap stop EXIT

CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --quiet --release --example quorum_bench
bench=target/release/examples/quorum_bench

for port in $(seq "$base" $((base + 4))); do
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
    --daemonize yes --pidfile "$dir/$port.pid" --logfile "$dir/$port.log"
done
for port in $(seq "$base" $((base + 4))); do
  wait_for_server "$port" "$dir/$port.log"
done
scripts/cluster.sh up --base-port "$cport" >/dev/null

echo "redis $(redis-server --version | grep -o 'v=[0-9.]*'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
  "rslock $(grep -A1 '^name = "rslock"' Cargo.lock | grep -o '[0-9][0-9.]*'), ${seconds}s per throughput measurement, ${pairs} pairs per latency measurement"
run() { "$bench" --seconds "$seconds" --pairs "$pairs" "$@" | tee -a "$out"; }

# Warm-up, not printed (first measurements of a run come out low otherwise; see bench-speed.sh).
"$bench" --seconds 2 --pairs 500 --url "$standalone" quorum --nodes 3 --tasks 16 >/dev/null

echo "== quorum lock vs rslock Redlock, standalone servers $standalone"
run --url "$standalone" quorum --nodes 3,5 --tasks 16,64
echo "== multi-lock across the masters of the cluster $cluster"
run --url "$cluster" multi --members 1,2,5,10 --tasks 16

echo "== ratios (this run)"
field() { # field PATTERN KEY
  grep -- "$1" "$out" | head -1 | tr ' ' '\n' | grep "^$2=" | cut -d= -f2
}
ratio() { # ratio LABEL A B
  if [ -n "$2" ] && [ -n "$3" ]; then
    echo "ratio $1=$(echo "scale=2; $2 / $3" | bc -l) ($2 / $3)"
  fi
}
for n in 3 5; do
  ratio "quorum_n${n}_pair_p50_fencelock/rslock" \
    "$(field "latency nodes=$n lib=fencelock" pair_p50_us)" "$(field "latency nodes=$n lib=rslock" pair_p50_us)"
  for t in 16 64; do
    ratio "quorum_n${n}_tasks${t}_pairs/s_fencelock/rslock" \
      "$(field "throughput nodes=$n lib=fencelock tasks=$t " pairs/s)" \
      "$(field "throughput nodes=$n lib=rslock tasks=$t " pairs/s)"
  done
done
