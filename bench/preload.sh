#!/usr/bin/env bash
# The interposition library (libsurge_preload.so, crates/surge-preload) against the same
# workloads through FUSE alone, in the same default job instance (`#DW jobdw type=scratch
# access_mode=striped capacity=4GiB`, the embedded default's 4 servers), sides alternating
# from workload to workload and run to run:
#   fuse - the workload through the mount alone
#   pre  - the same with LD_PRELOAD=libsurge_preload.so (descriptors adopted at open)
#   lazy - the same with SURGE_PRELOAD_ADOPT=fsync (adopted at their first fsync)
# Workloads (bench/preload_io.c, timed in the process):
#   seq8m     8 MiB writes of SEQ MiB, one fsync at the end (MiB/s)
#   fsync4k   4 KiB writes each followed by fsync, FSYNCS of them (ops/s)
#   small     create + write 4 KiB + close of SMALL files (files/s)
# Prints each run's rates, then medians and the ratios pre/fuse and lazy/fuse per run, and
# the library's counters of the last `pre` run of each workload (it did the writes).
#
#   bench/preload.sh [--runs 3] [--seq 512] [--fsyncs 5000] [--small 2000]
# Needs root (FUSE mounts, kernel passthrough) and gcc.
# SURGE=path/to/surge (default target/release/surge, built if missing); the library is
# looked for next to it.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=3 SEQ=512 FSYNCS=5000 SMALL=2000
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --seq) SEQ=$2; shift 2 ;;
        --fsyncs) FSYNCS=$2; shift 2 ;;
        --small) SMALL=$2; shift 2 ;;
        -h|--help) sed -n 2,19p "$0"; exit 0 ;;
        *) echo "preload.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "preload.sh: run as root (FUSE mounts, passthrough)" >&2; exit 2; }
SURGE=${SURGE:-target/release/surge}
[ -x "$SURGE" ] || cargo build --release -p surge-cli -p surge-preload
SURGE=$(realpath "$SURGE")
LIB=$(dirname "$SURGE")/libsurge_preload.so
[ -f "$LIB" ] || cargo build --release -p surge-preload
[ -f "$LIB" ] || { echo "preload.sh: $LIB is missing" >&2; exit 1; }

WORK=$(mktemp -d /tmp/surge-preload-bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT INT TERM
gcc -O2 -o "$WORK/preload_io" bench/preload_io.c

cat > "$WORK/job.sh" <<EOF
#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=4GiB
set -eu
D=\$DW_JOB_STRIPED
run() { # side workload -> rate
    local side=\$1 w=\$2 pre=()
    [ "\$side" = pre ] && pre=(env LD_PRELOAD="$LIB" SURGE_PRELOAD_STATS="$WORK/stats-\$w.json")
    [ "\$side" = lazy ] && pre=(env LD_PRELOAD="$LIB" SURGE_PRELOAD_ADOPT=fsync)
    mkdir -p "\$D/\$side"
    case \$w in
        seq8m) "\${pre[@]}" "$WORK/preload_io" seq "\$D/\$side/seq" $SEQ ;;
        fsync4k) "\${pre[@]}" "$WORK/preload_io" fsync "\$D/\$side/fsync" $FSYNCS ;;
        small) mkdir -p "\$D/\$side/small"; "\${pre[@]}" "$WORK/preload_io" small "\$D/\$side/small" $SMALL ;;
    esac
    rm -rf "\$D/\$side"
}
for r in \$(seq $RUNS); do
    for w in seq8m fsync4k small; do
        case \$(( (r + \${#w}) % 3 )) in
            0) order="pre fuse lazy" ;; 1) order="fuse lazy pre" ;; *) order="lazy pre fuse" ;;
        esac
        for side in \$order; do
            echo "\$r \$w \$side \$(run \$side \$w)"
        done
    done
done
EOF
chmod 755 "$WORK/job.sh"
(cd "$WORK" && "$SURGE" run "$WORK/job.sh") > "$WORK/results" 2> "$WORK/run.log" || {
    echo "preload.sh: the job failed:" >&2; cat "$WORK/run.log" "$WORK/results" >&2; exit 1; }

python3 - "$WORK/results" "$WORK" <<'PY'
import collections, json, statistics, sys, glob, os
lines = open(sys.argv[1]).read().splitlines()
rows = [l.split() for l in lines if len(l.split()) == 4 and l.split()[0].isdigit()]
for l in lines:
    if l.split() not in rows:
        print("job:", l)
for r in rows:
    print("run", " ".join(r))
v = collections.defaultdict(dict)
for r, w, side, rate in rows:
    v[(w, int(r))][side] = float(rate)
units = {"seq8m": "MiB/s", "fsync4k": "ops/s", "small": "files/s"}
print(f"{'workload':9} {'unit':8} {'fuse':>10} {'pre':>10} {'lazy':>10} {'pre/fuse':>9} {'lazy/fuse':>9}   per run pre/fuse | lazy/fuse")
for w in ["seq8m", "fsync4k", "small"]:
    runs = sorted(r for (x, r) in v if x == w)
    med = {k: statistics.median(v[(w, r)][k] for r in runs) for k in ("fuse", "pre", "lazy")}
    rp = [v[(w, r)]["pre"] / v[(w, r)]["fuse"] for r in runs]
    rl = [v[(w, r)]["lazy"] / v[(w, r)]["fuse"] for r in runs]
    print(f"{w:9} {units[w]:8} {med['fuse']:10.1f} {med['pre']:10.1f} {med['lazy']:10.1f} "
          f"{statistics.median(rp):9.2f} {statistics.median(rl):9.2f}   "
          + " ".join(f"{x:.2f}" for x in rp) + " | " + " ".join(f"{x:.2f}" for x in rl))
for f in sorted(glob.glob(os.path.join(sys.argv[2], "stats-*.json"))):
    s = json.load(open(f))
    print(f"library counters, last {os.path.basename(f)[6:-5]} run: adopted {s['adopted']}, "
          f"writes {s['writes']} ({s['write_bytes'] >> 20} MiB), fsyncs {s['fsyncs']}")
PY
