# syntax=docker/dockerfile:1
# The `fencelock` command line in an image, built from this repository; no Rust toolchain is
# needed on the machine that builds it. Multi-stage: the toolchain stays in the first stage.
#   docker build -t fencelock .
#   docker run --rm fencelock --url redis://redis.internal:6379 status orders:42
# The `cluster-client` stage adds the loopback forwarders cluster-compose/ uses (see
# cluster-compose/README.md). Not built on the development machines (no Docker engine).

# Rust 1.89: the crate's rust-version (Cargo.toml).
FROM rust:1.89-bookworm AS build
WORKDIR /src
# Everything but what .dockerignore leaves out (target/, .git/): Cargo resolves every target the
# manifest names (examples included) even to build one binary.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin fencelock \
    && cp target/release/fencelock /usr/local/bin/fencelock

FROM debian:bookworm-slim AS runtime
# ca-certificates: `rediss://` URLs verify servers against the platform's roots by default.
# tini runs as PID 1: it reaps the processes a command run by `fencelock exec` leaves orphaned
# (fencelock waits only for its own command) and passes signals on to fencelock.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates tini \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/fencelock /usr/local/bin/fencelock
ENTRYPOINT ["tini", "--", "fencelock"]

# For cluster-compose/: socat forwards 127.0.0.1:<port> to each node, so the addresses the
# cluster announces (127.0.0.1:7000-7005) lead to the nodes from inside this container too.
FROM runtime AS cluster-client
RUN apt-get update \
    && apt-get install -y --no-install-recommends socat \
    && rm -rf /var/lib/apt/lists/*
COPY cluster-compose/forward-and-run.sh /usr/local/bin/forward-and-run
ENTRYPOINT ["forward-and-run"]

# The last stage is what a plain `docker build .` produces.
FROM runtime
