#!/usr/bin/env bash
# Runs everything CI runs: installs what is missing, checks formatting, lints, runs all tests.
# The tests start and stop their own Redis and PostgreSQL servers on free 127.0.0.1 ports.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
. "$here/lib.sh"
ensure_build_tools
ensure_redis
ensure_postgres
ensure_test_tools
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --all-targets --all-features -- -D warnings
echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --all-features --quiet
echo "== the Redis module (scripts/build-module.sh; the module tests load it)"
FENCELOCK_MODULE=$(bash scripts/build-module.sh | tail -1)
export FENCELOCK_MODULE
# The module is its own workspace (module/): its formatting, lints and unit tests, after the
# build above installed libclang. Same CARGO_TARGET_DIR as everything else when set, else
# module/target. About 3 minutes cold on 2 shared cores (clippy 1.5 min, the unit tests' debug
# build 1.5 min), about 1 s warm.
echo "== the Redis module's own checks (module/: fmt, clippy, unit tests)"
(
  cd module
  cargo fmt --check
  cargo clippy --all-targets -- -D warnings
  cargo test --quiet
)
echo "== cargo test"
cargo test --all-features
