#!/usr/bin/env bash
# Issue 11: fencelock side by side with rslock, and against the server's ceiling for
# fencelock's own scripts, in ONE run. Starts a standalone server on BASE_PORT (default 7600)
# and a 3-master/3-replica cluster on BASE_PORT+1..BASE_PORT+6 (scripts/cluster.sh), builds
# release, runs examples/speed.rs and redis-benchmark, prints one `speed ...` line per figure and
# `ratio ...` lines at the end, and stops what it started (by pid) on exit. Every measurement
# starts on emptied servers (`speed --flush`): fencelock keeps released locks' keys until their
# lease and expiry grace have passed, and the library measured next would otherwise run among them.
#   BASE_PORT=7600 SECONDS_PER_RUN=10 scripts/bench-speed.sh
# Results: docs/benchmarks.md, "Speed against rslock (issue 11)".
# With MODULE=/path/to/libfencelock_module.so (scripts/build-module.sh) every server loads
# fencelock's Redis module (issue 24): the `fencelock` lines then go through it (the client's
# default, ModuleUse::Auto), and (a) and (c) also measure `fencelock-scripts` (the module off)
# in the same run. MODULE_ARGS (e.g. "release-deletes yes", docs/module.md) are the standalone
# server's module load arguments (a cluster's nodes refuse that one and load the module without).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
ensure_redis
base=${BASE_PORT:-7600}
seconds=${SECONDS_PER_RUN:-10}
cport=$((base + 1))
standalone=redis://127.0.0.1:$base
cluster=$(seq -s, -f "redis://127.0.0.1:%g" "$cport" $((cport + 2)))
dir=$(mktemp -d)
out=$dir/lines

stop() {
  stop_server_in "$dir"
  scripts/cluster.sh down --base-port "$cport" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap stop EXIT

CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --quiet --release --bin fencelock --example speed
tdir=${CARGO_TARGET_DIR:-target}
speed=$tdir/release/examples/speed
fencelock=$tdir/release/fencelock

module_args=""; libs=fencelock,rslock
if [ -n "${MODULE:-}" ]; then
  MODULE=$(module_path "$MODULE")
  module_args="--loadmodule $MODULE"; libs=fencelock,fencelock-scripts,rslock
fi
standalone_module_args=$module_args
if [ -n "${MODULE:-}" ]; then standalone_module_args="$module_args ${MODULE_ARGS:-}"; fi
# shellcheck disable=SC2086
redis-server --port "$base" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
  --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" $standalone_module_args
wait_for_server "$base" "$dir/redis.log"
REDIS_ARGS="$module_args" scripts/cluster.sh up --base-port "$cport" >/dev/null

echo "redis $(redis-server --version | grep -o 'v=[0-9.]*'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
  "rslock $(grep -A1 '^name = "rslock"' Cargo.lock | grep -o '[0-9][0-9.]*'), ${seconds}s per measurement"
run() { "$speed" --seconds "$seconds" --flush "$@" | tee -a "$out"; }

# Warm-up, not printed: without it the first cluster measurement of a run came out ~30% below
# the same measurement later in the run (three runs out of three), which would favour rslock,
# measured second.
for target in standalone cluster; do
  url=$standalone; [ $target = cluster ] && url=$cluster
  "$speed" --seconds 3 --url "$url" --target $target --libs fencelock,rslock pairs >/dev/null
done

echo "== (a) uncontended acquire + release, 64 tasks, random names of their own"
run --libs "$libs" --url "$standalone" --target standalone pairs --tasks 64
run --libs "$libs" --url "$cluster" --target cluster pairs --tasks 64
# The same with one client worker thread: the client's runtime otherwise has one worker per core,
# and on this machine it shares both with the server (in (d) the one-thread redis-benchmark
# leaves the server a core of its own).
echo "== (a1) the same, the client on one Tokio worker thread"
run --workers 1 --url "$standalone" --target standalone pairs --tasks 64
run --workers 1 --url "$cluster" --target cluster pairs --tasks 64
echo "== (b) contended: 16 tasks on one lock, hold 0"
run --url "$standalone" --target standalone contended --tasks 16
run --url "$cluster" --target cluster contended --tasks 16
echo "== (c) one task: acquire / release latency"
run --libs "$libs" --url "$standalone" --target standalone latency --pairs "${LATENCY_PAIRS:-5000}"
run --libs "$libs" --url "$cluster" --target cluster latency --pairs "${LATENCY_PAIRS:-5000}"
echo "== (e) fence modes, fencelock, 64 tasks, cluster"
run --url "$cluster" --target cluster modes --tasks 64

echo "== (d) the server's ceiling: redis-benchmark, 64 clients, pipeline 16, standalone server"
a=$(redis-cli -p "$base" script load "$($fencelock script acquire)")
r=$(redis-cli -p "$base" script load "$($fencelock script release)")
# Acquires on names drawn from 10^8 (nearly all fresh: grants), TTL 10 s, clock mode, grace 10 s.
acq_n=$((seconds * 40000))
acq=$(redis-benchmark -p "$base" -c 64 -P 16 -n "$acq_n" -r 100000000 --csv \
  EVALSHA "$a" 1 "speed:ceil:__rand_int__:lock" o 10000 0 clock 10000 | tail -1 | cut -d, -f2 | tr -d '"')
# Releases need held keys: owner o first takes R names (redis-cli --pipe), then redis-benchmark
# releases N = R/3 random ones of them; (1 - e^-1/3) * 3 = 85% of those calls free a held lock,
# the rest find it free already (a no-op release).
held=$((seconds * 30000))
rel_n=$((held / 3))
awk -v n="$held" -v sha="$a" 'BEGIN {
  for (i = 0; i < n; i++) {
    key = sprintf("speed:rel:%012d:lock", i)
    printf "*9\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$1\r\n1\r\n$%d\r\n%s\r\n$1\r\no\r\n$5\r\n10000\r\n$1\r\n0\r\n$5\r\nclock\r\n$5\r\n10000\r\n", length(sha), sha, length(key), key
  }
}' | redis-cli -p "$base" --pipe >/dev/null
rel=$(redis-benchmark -p "$base" -c 64 -P 16 -n "$rel_n" -r "$held" --csv \
  EVALSHA "$r" 1 "speed:rel:__rand_int__:lock" o "" p 10000 | tail -1 | cut -d, -f2 | tr -d '"')
echo "speed ceiling target=standalone acquire/s=${acq} release/s=${rel} pairs/s=$(printf %.0f "$(echo "1 / (1 / $acq + 1 / $rel)" | bc -l)")" | tee -a "$out"

echo "== ratios (this run)"
field() { # field KIND TARGET LIB KEY [EXTRA-MATCH]: from the first line that matches
  { grep "^speed $1 target=$2 lib=$3 .*${5:-}" "$out" || true; } | head -1 | tr ' ' '\n' |
    { grep "^$4=" || true; } | cut -d= -f2
}
ratio() { # ratio LABEL A B
  if [ -n "$2" ] && [ -n "$3" ]; then
    echo "ratio $1=$(echo "scale=2; $2 / $3" | bc -l) ($2 / $3)"
  fi
}
ceiling=$(grep '^speed ceiling' "$out" | tr ' ' '\n' | grep '^pairs/s=' | cut -d= -f2)
for target in standalone cluster; do
  f=$(field pairs $target fencelock pairs/s)
  s=$(field pairs $target rslock pairs/s)
  ratio "pairs_${target}_fencelock/rslock" "$f" "$s"
  ratio "pairs_${target}_fencelock-scripts/rslock" "$(field pairs $target fencelock-scripts pairs/s)" "$s"
  ratio "latency_${target}_fencelock/rslock" \
    "$(field latency $target fencelock pairs/s)" "$(field latency $target rslock pairs/s)"
  if [ $target = standalone ]; then ratio "pairs_standalone_fencelock/ceiling" "$f" "$ceiling"; fi
  f1=$(field pairs $target fencelock pairs/s "workers=1 ")
  ratio "pairs_${target}_one_worker_fencelock/rslock" "$f1" "$(field pairs $target rslock pairs/s "workers=1 ")"
  if [ $target = standalone ]; then ratio "pairs_standalone_one_worker_fencelock/ceiling" "$f1" "$ceiling"; fi
  ratio "contended_${target}_fencelock/rslock" \
    "$(field contended $target fencelock grants/s)" "$(field contended $target rslock grants/s)"
done
mode_rate() { # mode_rate MODE: the (e) line of fence mode MODE
  { grep "^speed pairs target=cluster lib=fencelock mode=$1 " "$out" || true; } | tail -1 |
    tr ' ' '\n' | { grep '^pairs/s=' || true; } | cut -d= -f2
}
ratio "cluster_epoch/clock" "$(mode_rate epoch)" "$(mode_rate clock)"
ratio "cluster_epoch-clock/clock" "$(mode_rate epoch-clock)" "$(mode_rate clock)"
