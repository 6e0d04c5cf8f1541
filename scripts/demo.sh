#!/usr/bin/env bash
# The demo: starts a local 3-master/3-replica cluster on 127.0.0.1:7000-7005 if none is running,
# runs workers that contend for one lock and write through a fenced store, and stops the cluster
# again if it started it.
#   scripts/demo.sh [--base-port PORT]   (or BASE_PORT=PORT; default 7000: ports PORT..PORT+5)
# The demo passes the cluster's URL explicitly (fencelock's own default is redis://127.0.0.1:6379).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
base=${BASE_PORT:-7000}
while [ $# -gt 0 ]; do
  case "$1" in
    --base-port) base=$2; shift 2 ;;
    --base-port=*) base=${1#--base-port=}; shift ;;
    *) echo "unknown option $1 (use --base-port PORT)" >&2; exit 2 ;;
  esac
done
case "$base" in
  ''|*[!0-9]*) echo "the base port must be a number, got '$base'" >&2; exit 2 ;;
esac
ensure_build_tools
ensure_redis
started=no
if ! redis-cli -p "$base" cluster info 2>/dev/null | grep -q cluster_state:ok; then
  "$here/cluster.sh" up --base-port "$base"
  started=yes
fi
stop() { if [ "$started" = yes ]; then "$here/cluster.sh" down --base-port "$base"; fi; }
trap stop EXIT
cargo run --quiet --release --example demo -- "redis://127.0.0.1:$base"
