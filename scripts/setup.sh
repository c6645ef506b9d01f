#!/usr/bin/env bash
# Installs what Surge needs on a fresh Debian machine: FUSE 3, the protobuf compiler (for the
# manager's gRPC API), fio and strace (benchmarks and profiler tests), a C compiler (the
# profiler's interposition library) and Open MPI (the MPI-IO benchmark backend). Idempotent and
# quiet when everything is there.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have fusermount3 || need+=(fuse3)
[ -f /usr/include/fuse3/fuse_lowlevel.h ] || need+=(libfuse3-dev)
have pkg-config  || need+=(pkg-config)
have protoc      || need+=(protobuf-compiler)
have fio         || need+=(fio)
have strace      || need+=(strace)
have jq          || need+=(jq)
have gcc         || need+=(gcc)
have make        || need+=(make)
have sqlite3     || need+=(sqlite3)
# MPI-IO: `surge bench io --backend mpiio` and the MPI jobs `surge tune` tunes.
have mpicc       || need+=(libopenmpi-dev)
have mpirun      || need+=(openmpi-bin)

if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && have apt-get; then
        echo "setup: installing ${need[*]}"
        export DEBIAN_FRONTEND=noninteractive
        # apt-get has been seen to fail transiently mid-unpack on these machines; retry once.
        for attempt in 1 2; do
            if apt-get update -qq && apt-get install -y -qq "${need[@]}" >/tmp/surge-apt.log 2>&1; then
                break
            fi
            [ $attempt -eq 2 ] && { echo "setup: apt-get install failed, see /tmp/surge-apt.log" >&2; exit 1; }
            sleep 2
        done
    else
        echo "setup: missing packages: ${need[*]} (run as root on Debian to install them)" >&2
    fi
fi

if ! have cargo; then
    echo "setup: cargo not found; install Rust stable (https://rustup.rs) and re-run" >&2
    exit 1
fi

# PyDarshan reads binary Darshan logs for `surge profile --from x.darshan` (Debian packages no
# darshan-util); optional: without it, darshan-parser text output still imports.
if have python3 && ! python3 -c 'import darshan' >/dev/null 2>&1; then
    python3 -m pip install -q darshan==3.5.0 >/tmp/surge-pip.log 2>&1 \
        || echo "setup: PyDarshan not installed (see /tmp/surge-pip.log); binary Darshan logs will not import" >&2
fi
