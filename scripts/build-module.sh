#!/usr/bin/env bash
# Issue 24: builds fencelock's Redis module (the crate in module/, not part of the root package's
# build) in release mode and prints the path of the shared object on its last line, for
# `redis-server --loadmodule PATH` or `MODULE LOAD PATH` (Redis 7.0 or later). The build's
# bindgen step needs libclang: installed here with apt-get when missing. Respects
# CARGO_TARGET_DIR (default: module/target) and CARGO_BUILD_JOBS (default 1).
#   MODULE=$(scripts/build-module.sh | tail -1)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../module"
# The -dev package, not only a libclang runtime another package pulled in: bindgen also needs
# clang's builtin headers (libclang-common-*-dev).
if ! dpkg -s libclang-dev >/dev/null 2>&1; then
  echo "installing libclang-dev and clang with apt-get (bindgen needs them)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libclang-dev clang >/dev/null
fi
CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} cargo build --release --quiet >&2
target=${CARGO_TARGET_DIR:-target}
case "$target" in /*) ;; *) target=$PWD/$target ;; esac
so=$target/release/libfencelock_module.so
if [ ! -f "$so" ]; then echo "build-module: $so was not built" >&2; exit 1; fi
echo "$so"
