#!/usr/bin/env bash
# The demo: starts a local 3-master/3-replica cluster on 127.0.0.1:7000-7005 if none is running,
# runs workers that contend for one lock and write through a fenced store, and stops the cluster
# again if it started it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
ensure_redis
started=no
if ! redis-cli -p 7000 cluster info 2>/dev/null | grep -q cluster_state:ok; then
  "$here/cluster.sh" up
  started=yes
fi
stop() { if [ "$started" = yes ]; then "$here/cluster.sh" down; fi; }
trap stop EXIT
cargo run --quiet --release --example demo -- redis://127.0.0.1:7000
