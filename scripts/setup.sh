#!/usr/bin/env bash
# Installs what Surge needs on a fresh Debian machine: FUSE 3, the protobuf compiler (for the
# manager's gRPC API), fio and strace (benchmarks and profiler tests), a C compiler (the
# profiler's interposition library), gfortran (the libdatawarp tests build Fortran programs),
# Chromium (the dashboard test renders the page headless) and Open MPI (the MPI-IO benchmark
# backend). Idempotent and quiet when everything is there.
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
have gfortran    || need+=(gfortran)
have chromium    || need+=(chromium)
have make        || need+=(make)
have sqlite3     || need+=(sqlite3)
# setfattr/getfattr: layouts through a mount (user.surge.layout) in tests and benchmarks.
have setfattr    || need+=(attr)
# MUNGE authenticates every client of the manager (munged, mungekey, libmunge to link).
have munged      || need+=(munge)
[ -f /usr/include/munge.h ] || need+=(libmunge-dev)
# fsx and fsstress (xfstests, built from ../shared/tools/fs-suites) include <xfs/xfs.h>.
[ -f /usr/include/xfs/xfs.h ] || need+=(xfslibs-dev)
# The C pjdfstest (built from ../shared/tools/fs-suites): autotools, and prove (perl) runs it.
have autoreconf  || need+=(autoconf automake)
have libtoolize  || need+=(libtool)
have prove       || need+=(perl)
# xfstests (built from ../shared/tools/fs-suites; tests/xfstests/run.sh, xfstests.rs): what its
# README asks for, and bindfs, the reference FUSE file system run.sh compares with.
have gawk        || need+=(gawk)
have bc          || need+=(bc)
have setfacl     || need+=(acl)
# rsync: semantics.rs copies a tree with hard links, ACLs and xattrs in and out (-aHAX).
have rsync       || need+=(rsync)
have uuidgen     || need+=(uuid-runtime)
have fuser       || need+=(psmisc)
have bindfs      || need+=(bindfs)
have mkfs.xfs    || need+=(xfsprogs)
# chattr/lsattr (semantics.rs, xfstests generic/277 424) and capsh (generic/545 555).
have chattr      || need+=(e2fsprogs)
have capsh       || need+=(libcap2-bin)
[ -f /usr/include/sys/acl.h ] || need+=(libacl1-dev)
[ -f /usr/include/libaio.h ] || need+=(libaio-dev)
[ -f /usr/include/sys/capability.h ] || need+=(libcap-dev)
[ -f /usr/include/gdbm.h ] || need+=(libgdbm-dev libgdbm-compat-dev)
[ -f /usr/include/liburing.h ] || need+=(liburing-dev)
[ -f /usr/include/uuid/uuid.h ] || need+=(uuid-dev)
have libtool     || need+=(libtool-bin)
# MPI-IO: `surge bench io --backend mpiio` and the MPI jobs `surge tune` tunes.
have mpicc       || need+=(libopenmpi-dev)
have mpirun      || need+=(openmpi-bin)
# etcd: the cluster store several managers share (surge manager --etcd; tests start members).
have etcd        || need+=(etcd-server)
have etcdctl     || need+=(etcd-client)

if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ] && have apt-get; then
        echo "setup: installing ${need[*]}"
        export DEBIAN_FRONTEND=noninteractive
        # apt-get has been seen to fail transiently mid-unpack on these machines; retry once.
        for attempt in 1 2; do
            # Another apt (a parallel setup) may hold the lock: wait for it rather than fail.
            if apt-get -o DPkg::Lock::Timeout=300 update -qq \
                && apt-get -o DPkg::Lock::Timeout=300 install -y -qq "${need[@]}" >/tmp/surge-apt.log 2>&1; then
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

# The metrics tests parse /metrics with the Prometheus project's own OpenMetrics parser (the
# Python client's); without it they skip and say so.
if have python3 && ! python3 -c 'import prometheus_client.openmetrics.parser' >/dev/null 2>&1; then
    python3 -m pip install -q prometheus-client==0.26.0 >/tmp/surge-pip.log 2>&1 \
        || echo "setup: prometheus_client not installed (see /tmp/surge-pip.log); the metrics tests will skip" >&2
fi

# The Python package (crates/surge-py) is built with maturin and tested with pytest.
if have python3; then
    python3 -m maturin --version >/dev/null 2>&1 || python3 -m pip install -q maturin==1.16.0 >/tmp/surge-pip.log 2>&1 \
        || { echo "setup: maturin could not be installed (see /tmp/surge-pip.log)" >&2; exit 1; }
    python3 -m pytest --version >/dev/null 2>&1 || python3 -m pip install -q pytest==9.2.0 >/tmp/surge-pip.log 2>&1 \
        || { echo "setup: pytest could not be installed (see /tmp/surge-pip.log)" >&2; exit 1; }
fi

# The file-system suites nobody here wrote (docs/SEMANTICS.md, `make test`): pjdfstest from the
# Rust package registry, and fsx/fsstress built from ../shared/tools/fs-suites when that folder
# is there (the tests say they skip fsx/fsstress otherwise). Into .tools/bin, not the system.
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/.tools"
if [ ! -x "$tools/bin/pjdfstest" ]; then
    echo "setup: installing pjdfstest 0.2.2 into $tools (cargo install, about a minute)"
    cargo install pjdfstest --version 0.2.2 --locked --root "$tools" >/tmp/surge-pjdfstest.log 2>&1 \
        || { echo "setup: cargo install pjdfstest failed, see /tmp/surge-pjdfstest.log" >&2; exit 1; }
fi
suites=${SURGE_FS_SUITES:-$root/../shared/tools/fs-suites}
if [ -x "$suites/build.sh" ]; then
    if [ ! -x "$tools/bin/fsx" ] || [ ! -x "$tools/bin/fsstress" ] \
        || [ -n "$(find "$suites/xfstests" -newer "$tools/bin/fsx" -print -quit)" ]; then
        echo "setup: building fsx and fsstress from $suites"
        "$suites/build.sh" "$tools/bin" >/tmp/surge-fs-suites.log 2>&1 \
            || { echo "setup: building fsx/fsstress failed, see /tmp/surge-fs-suites.log" >&2; exit 1; }
    fi
    # The C pjdfstest (8,798 subtests, more than the Rust port: e.g. chown clearing setuid),
    # built in .tools/pjdfstest-c where its tests find the binary.
    if [ -f "$suites/pjdfstest-c.tar.gz" ] && { [ ! -x "$tools/pjdfstest-c/pjdfstest" ] \
        || [ "$suites/pjdfstest-c.tar.gz" -nt "$tools/pjdfstest-c/pjdfstest" ]; }; then
        echo "setup: building the C pjdfstest from $suites"
        rm -rf "$tools/pjdfstest-c" && mkdir -p "$tools/pjdfstest-c"
        ( tar -xzf "$suites/pjdfstest-c.tar.gz" --strip-components=1 -C "$tools/pjdfstest-c" \
            && cd "$tools/pjdfstest-c" && autoreconf -ifs && ./configure && make ) \
            >/tmp/surge-pjdfstest-c.log 2>&1 \
            || { echo "setup: building the C pjdfstest failed, see /tmp/surge-pjdfstest-c.log" >&2; exit 1; }
    fi
    # xfstests (tests/xfstests/run.sh and the subset in `make test`), built in .tools/xfstests.
    if [ -f "$suites/xfstests-full.tar.gz" ] && { [ ! -x "$tools/xfstests/src/open_by_handle" ] \
        || [ "$suites/xfstests-full.tar.gz" -nt "$tools/xfstests/src/open_by_handle" ]; }; then
        echo "setup: building xfstests from $suites (a few minutes)"
        rm -rf "$tools/xfstests" && mkdir -p "$tools"
        ( tar -xzf "$suites/xfstests-full.tar.gz" -C "$tools" && make -C "$tools/xfstests" -j"$(nproc)" ) \
            >/tmp/surge-xfstests.log 2>&1 \
            || { echo "setup: building xfstests failed, see /tmp/surge-xfstests.log" >&2; exit 1; }
    fi
fi

# FUSE over io_uring (Linux >= 6.14): off by default in the kernel; Surge's mounts use it where
# it is on (docs/DATAPLANE.md "FUSE transports"), so the tests run the mounts over it.
uring=/sys/module/fuse/parameters/enable_uring
if [ "$(id -u)" -eq 0 ] && [ -w "$uring" ] && [ "$(cat "$uring")" != Y ]; then
    echo "setup: enabling FUSE over io_uring ($uring = Y)"
    echo Y > "$uring" || echo "setup: cannot set $uring (mounts will use /dev/fuse)" >&2
fi
