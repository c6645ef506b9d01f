#!/usr/bin/env bash
# Overhead of `surge profile` on metadata-heavy runs, as ratios against the same command without
# profiling, measured in the same invocation, runs interleaved, medians reported.
#
#   crates/surge-profile/bench/shim_overhead.sh [RUNS]      (default 7 runs of each)
#
# Workloads (in a directory under /dev/shm, the RAM tier, where per-call overhead shows most):
#   md-loop      a C loop: 20,000 stat + 5,000 open/fstat/close + 5,000 failed stats (worst case:
#                nothing but metadata calls)
#   camp-builddb examples/workflows/camp/builddb.py: Python importing through 40 path entries
#                and 300 SQLite transactions (~18,000 I/O calls)
# Variants: "shim" = LD_PRELOAD of the shim alone; "surge" = `surge profile --json` end to end
# (spawn, shim, reading and merging the records, JSON). Set SURGE to the binary to use.
set -euo pipefail
RUNS=${1:-7}
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
SURGE=${SURGE:-$ROOT/target/debug/surge}
[ -x "$SURGE" ] || { echo "build surge first (cargo build -p surge-cli) or set SURGE" >&2; exit 1; }
PY=$(python3 -c 'import sys; print(sys.executable)')
BASE=/dev/shm; [ -d "$BASE" ] || BASE=${TMPDIR:-/tmp}
W=$(mktemp -d "$BASE/surge-overhead.XXXXXX")
trap 'rm -rf "$W"' EXIT

cat > "$W/mdloop.c" <<'C'
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
int main(int argc, char **argv) {
    char p[4096]; struct stat st;
    for (int i = 0; i < 100; i++) { snprintf(p, sizeof p, "%s/f%d", argv[1], i); close(open(p, O_CREAT | O_WRONLY, 0644)); }
    for (int i = 0; i < 20000; i++) { snprintf(p, sizeof p, "%s/f%d", argv[1], i % 100); stat(p, &st); }
    for (int i = 0; i < 5000; i++) { snprintf(p, sizeof p, "%s/f%d", argv[1], i % 100); int fd = open(p, O_RDONLY); fstat(fd, &st); close(fd); }
    for (int i = 0; i < 5000; i++) { snprintf(p, sizeof p, "%s/missing%d", argv[1], i); stat(p, &st); }
    return 0;
}
C
cc -O2 -o "$W/mdloop" "$W/mdloop.c"
mkdir -p "$W/md" "$W/camp"
"$PY" "$ROOT/examples/workflows/camp/builddb.py" prepare "$W/camp" >/dev/null
# surge writes its embedded shim to the cache on first use; take the newest one.
"$SURGE" profile --json -- true >/dev/null 2>&1
SHIM=$(ls -t "${XDG_CACHE_HOME:-$HOME/.cache}"/surge/shim/libsurge_shim-*.so | head -1)

ns() { date +%s%N; }
declare -A T
run() { # name variant cmd...
    local name=$1 variant=$2; shift 2
    local t0; t0=$(ns)
    case $variant in
        plain) "$@" >/dev/null 2>&1 ;;
        shim) mkdir -p "$W/rec"; rm -f "$W/rec"/*; LD_PRELOAD=$SHIM SURGE_PROFILE_DIR=$W/rec "$@" >/dev/null 2>&1 ;;
        surge) "$SURGE" profile --json -- "$@" >/dev/null 2>&1 ;;
    esac
    T[$name.$variant]+="$(( ($(ns) - t0) / 1000 )) "
}
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

for _ in $(seq "$RUNS"); do
    for v in plain shim surge; do
        run md-loop $v "$W/mdloop" "$W/md"
        run camp-builddb $v "$PY" "$ROOT/examples/workflows/camp/builddb.py" run "$W/camp"
    done
done
printf '%-14s %12s %12s %12s %10s %10s\n' workload "plain ms" "shim ms" "surge ms" "shim x" "surge x"
for w in md-loop camp-builddb; do
    p=$(echo "${T[$w.plain]}" | median); s=$(echo "${T[$w.shim]}" | median); g=$(echo "${T[$w.surge]}" | median)
    awk -v w=$w -v p=$p -v s=$s -v g=$g 'BEGIN { printf "%-14s %12.1f %12.1f %12.1f %10.2f %10.2f\n", w, p/1000, s/1000, g/1000, s/p, g/p }'
done
echo "($RUNS runs each, medians; machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg))"
