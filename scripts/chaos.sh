#!/usr/bin/env bash
# The long fault-injection run (docs/safety.md): a fresh local cluster per fault, every fencelock
# primitive (mutex, rwlock, fair lock, semaphore, latch) and the plain SET NX PX recipe side by
# side, the checker's table printed in markdown. Arguments go to the chaos example, e.g.
# `scripts/chaos.sh --grants 1000 --faults kill,pause --locks mutex,semaphore,plain`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
ensure_redis
cargo run --quiet --release --example chaos -- "$@"
