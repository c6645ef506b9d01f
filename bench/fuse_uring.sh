#!/usr/bin/env bash
# FUSE over io_uring on this kernel (issue 17, lever 4: "a measured look ... with a
# recommendation"). `fuser` 0.18, which Surge's mount is built on, does not speak it; libfuse
# does from 3.18 (Debian 12 ships 3.14). So this measures libfuse's own passthrough_ll over a
# /dev/shm directory twice in one run, with `-o io_uring` (the kernel's
# /sys/module/fuse/parameters/enable_uring set to Y) and without, against the raw directory:
# what the transport alone changes for a daemon that copies every byte, the path a Surge file
# takes when the kernel cannot pass it through.
# Tests (fio psync): seq write/read 8 MiB x 2 processes, 4 KiB random read/write x 1 and 2;
# creates and unlinks (bench/md.c, 1 process, 10k files). Sides alternate per run.
#
#   bench/fuse_uring.sh LIBFUSE_SOURCE_DIR [--runs 3] [--size 512M] [--runtime 3]
#
# LIBFUSE_SOURCE_DIR: a libfuse >= 3.18 source tree (e.g. a checkout of
# github.com/libfuse/libfuse); built here with meson and liburing (apt-get install meson
# ninja-build liburing-dev). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] && [ -d "$1" ] || { sed -n 2,16p "$0"; exit 2; }
SRC=$(realpath "$1"); shift
RUNS=3 SIZE=512M RUNTIME=3
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --size) SIZE=$2; shift 2 ;;
        --runtime) RUNTIME=$2; shift 2 ;;
        *) echo "fuse_uring.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "fuse_uring.sh: run as root" >&2; exit 2; }
PARAM=/sys/module/fuse/parameters/enable_uring
[ -w "$PARAM" ] || { echo "fuse_uring.sh: this kernel has no $PARAM (FUSE over io_uring needs Linux >= 6.14)" >&2; exit 2; }
WORK=$(mktemp -d /tmp/surge-fuse-uring.XXXXXX)
SHM=$(mktemp -d /dev/shm/surge-fuse-uring.XXXXXX)
WAS=$(cat "$PARAM")
cleanup() {
    for m in "$WORK/classic" "$WORK/uring"; do fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
    echo "$WAS" > "$PARAM" 2>/dev/null || true
    rm -rf "$WORK" "$SHM"
}
trap cleanup EXIT INT TERM

meson setup "$WORK/build" "$SRC" -Dexamples=true -Dutils=false -Dtests=false >"$WORK/meson.log" 2>&1 \
    || { cat "$WORK/meson.log" >&2; exit 1; }
grep -q "io_uring support *: True" "$WORK/meson.log" \
    || { echo "fuse_uring.sh: libfuse built without io_uring (liburing-dev missing, or libfuse < 3.18)" >&2; exit 1; }
ninja -C "$WORK/build" example/passthrough_ll >"$WORK/ninja.log" 2>&1 || { cat "$WORK/ninja.log" >&2; exit 1; }
PLL=$WORK/build/example/passthrough_ll
gcc -O2 -o "$WORK/md" bench/md.c

echo Y > "$PARAM"
mkdir -p "$SHM/raw" "$SHM/classic" "$SHM/uring" "$WORK/classic" "$WORK/uring"
LD_LIBRARY_PATH=$WORK/build/lib "$PLL" -o source="$SHM/classic" "$WORK/classic" 2>"$WORK/classic.log" &
LD_LIBRARY_PATH=$WORK/build/lib "$PLL" -o source="$SHM/uring",io_uring "$WORK/uring" 2>"$WORK/uring.log" &
for _ in $(seq 100); do mountpoint -q "$WORK/classic" && mountpoint -q "$WORK/uring" && break; sleep 0.05; done
# Proof that the io_uring side is what it says: a short debug mount of the same binary with
# the same options logs "starting io-uring" and takes its requests as completions ("cqe").
mkdir -p "$WORK/probe-src" "$WORK/probe"
LD_LIBRARY_PATH=$WORK/build/lib timeout 5 "$PLL" -d -o source="$WORK/probe-src",io_uring \
    "$WORK/probe" >"$WORK/probe.log" 2>&1 &
for _ in $(seq 100); do mountpoint -q "$WORK/probe" && break; sleep 0.05; done
ls "$WORK/probe" >/dev/null; sleep 0.3
fusermount3 -u "$WORK/probe" 2>/dev/null || umount -l "$WORK/probe" 2>/dev/null || true
wait $! 2>/dev/null || true
if grep -q "starting io-uring" "$WORK/probe.log" && grep -q "^cqe unique" "$WORK/probe.log"; then
    echo "io_uring: on ($(grep -m1 'starting io-uring' "$WORK/probe.log"))" >&2
else
    echo "fuse_uring.sh: passthrough_ll -o io_uring did not use io_uring; its log:" >&2
    cat "$WORK/probe.log" >&2; exit 1
fi

declare -A DIR=([raw]=$SHM/raw [classic]=$WORK/classic [uring]=$WORK/uring)
RESULTS=$WORK/results; : > "$RESULTS"
fio_one() { # DIR NAME ARGS... -> prints MiB/s (bandwidth tests) or IOPS
    local d=$1 name=$2; shift 2
    local side=read; case "$*" in *write*) side=write ;; esac
    fio --name="$name" --directory="$d" --ioengine=psync --group_reporting --output-format=json "$@" \
        | python3 -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]['$side']; print(j['iops'] if '4k' in '$name' else j['bw_bytes']/1048576)"
}
side() { # RUN TARGET
    local d=${DIR[$2]}/t; mkdir -p "$d"
    echo "$1 $2 seqwrite $(fio_one "$d" seq --rw=write --bs=8M --size=$SIZE --numjobs=2)" >> "$RESULTS"
    echo "$1 $2 seqread $(fio_one "$d" seq --rw=read --bs=8M --size=$SIZE --numjobs=2)" >> "$RESULTS"
    rm -f "$d"/seq.*
    for n in 1 2; do
        echo "$1 $2 randread4k-$n $(fio_one "$d" r4k --rw=randread --bs=4k --size=128M --numjobs=$n --time_based --runtime=$RUNTIME)" >> "$RESULTS"
        echo "$1 $2 randwrite4k-$n $(fio_one "$d" r4k --rw=randwrite --bs=4k --size=128M --numjobs=$n --time_based --runtime=$RUNTIME)" >> "$RESULTS"
        rm -f "$d"/r4k.*
    done
    local md; md=$("$WORK/md" "$d" 10000 1)
    echo "$1 $2 create-1 $(echo "$md" | awk '/create/ {print $2}')" >> "$RESULTS"
    echo "$1 $2 unlink-1 $(echo "$md" | awk '/unlink/ {print $2}')" >> "$RESULTS"
    rm -rf "$d"
}
for run in $(seq "$RUNS"); do
    if [ $((run % 2)) -eq 1 ]; then order=(raw classic uring); else order=(uring classic raw); fi
    for t in "${order[@]}"; do side "$run" "$t"; done
    echo "run $run ($(IFS=,; echo "${order[*]}")) done" >&2
done
python3 - "$RESULTS" <<'EOF'
import statistics, sys
v = {}
for l in open(sys.argv[1]):
    r, t, test, val = l.split()
    if val:
        v.setdefault((t, test), []).append(float(val))
tests = []
for l in open(sys.argv[1]):
    if l.split()[2] not in tests:
        tests.append(l.split()[2])
m = lambda k: statistics.median(v[k]) if k in v else float("nan")
print(f"\n{'test':15} {'raw':>10} {'classic':>10} {'uring':>10} {'cl/raw':>7} {'ur/raw':>7} {'ur/cl':>6}   (MiB/s; IOPS for 4k; ops/s for md)")
for t in tests:
    raw, cl, ur = m(("raw", t)), m(("classic", t)), m(("uring", t))
    print(f"{t:15} {raw:10.0f} {cl:10.0f} {ur:10.0f} {cl/raw:7.2f} {ur/raw:7.2f} {ur/cl:6.2f}")
EOF
