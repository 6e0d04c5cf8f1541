#!/usr/bin/env bash
# The long fault-injection run (docs/safety.md): a fresh local cluster (or standalone server) per
# fault, every fencelock primitive (mutex, rwlock, fair lock, semaphore, latch) and the plain
# SET NX PX recipe side by side, the checker's table printed in markdown. Arguments go to the
# chaos example, e.g.
#   scripts/chaos.sh --grants 1000 --faults kill,pause --locks mutex,semaphore,plain
#   scripts/chaos.sh --grants 1000 --faults skew-1s,skew-5s,skew-60s --fence clock,epoch,counter
#   scripts/chaos.sh --grants 1000 --faults minority --ttl-ms 3000
# Faults: kill, pause, failover, force, takeover, forced-loss, migrate, client-pause (process
# faults); minority, latency, client-partition (network namespaces on a bridge: run as root,
# needs iproute2 and /dev/net/tun; every namespace and link is named flkf<pid>... and removed at
# the end, leftovers of killed runs on the next run); skew-0s, skew-1s, skew-5s, skew-60s (forced
# loss onto a replica whose wall clock is behind: needs gcc, which builds the LD_PRELOAD clock
# shim tests/common/clockshim.c); restart-empty, standalone-restart-empty (restarts without
# persistence). --fence runs each fault once per fence mode (clock, epoch, counter, epoch-clock;
# default: the library default, epoch-clock). --module on: every server loads fencelock's Redis
# module (built with scripts/build-module.sh unless FENCELOCK_MODULE names the .so), a standalone
# server with the load arguments in FENCELOCK_MODULE_ARGS (e.g. "release-deletes yes"), which the clients then use
# where it serves (issue 24); --workers 1 (default 4 per lane) leaves a lane's
# lock uncontended. Contended, the mutex lane's waiters queue on the server, and the module
# serves their places and the handoffs too.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
ensure_build_tools
ensure_redis
ensure_test_tools
cargo run --quiet --release --example chaos -- "$@"
