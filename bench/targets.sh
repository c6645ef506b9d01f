#!/usr/bin/env bash
# Performance targets (issue 18): a target asked for vs measured at the mount, with the peaks the
# manager keeps. Measures the embedded default's servers and curve (`surge pool calibrate`: one
# fragment on each server, then 2, 4, ... at once), then runs `#SURGE jobdw bandwidth=...` jobs
# at 0.5x, 1x and 2x one server's bandwidth and at the whole pool's, each with
# `surge run --measure-targets`, and prints fragments, promised and measured write and read
# bandwidth (measured / promised: the goal is within 20%, or refused up front).
#
# Usage: bench/targets.sh [--servers N] [--reps R]     (SURGE=path/to/surge to use a build)
# Needs root (FUSE); builds the release binary if missing and SURGE is not set.
set -euo pipefail
cd "$(dirname "$0")/.."
SERVERS=4
REPS=3
while [ $# -gt 0 ]; do
    case "$1" in
        --servers) SERVERS=$2; shift 2 ;;
        --reps) REPS=$2; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
if [ -z "${SURGE:-}" ]; then
    [ -x target/release/surge ] || cargo build --release -p surge-cli
    SURGE=$PWD/target/release/surge
fi
S=$SURGE
W=/tmp/surge-bench-targets
export SURGE_FAST_DIR=/dev/shm/surge-bench-targets SURGE_STATE_DIR=$W/state SURGE_SERVERS=$SERVERS
export SURGE_SERVER_CAPACITY=2GiB SURGE_GRANULARITY=512MiB
unset SURGE_MANAGER SURGE_PEAKS
rm -rf "$W" "$SURGE_FAST_DIR" && mkdir -p "$W" && cd "$W"
# Memory this VM never touched is ~9x slower to write the first time (2 GiB files into
# /dev/shm: 2.7 GB/s, then 0.3 GB/s once past what earlier runs touched): touch what the
# calibration and the jobs will use first, so neither side of the comparison pays it.
WARM_GIB=${WARM_GIB:-8}
for i in $(seq "$WARM_GIB"); do head -c 1G /dev/zero > "/dev/shm/surge-targets-warm.$i"; done
rm -f /dev/shm/surge-targets-warm.*
$S pool calibrate --deadline 2 --max-procs 4 2>&1 | sed 's/^/  /'
$S pool peaks --json > peaks.json
read -r one all <<<"$(python3 -c "
import json; v = json.load(open('peaks.json'))
bw = lambda p: min(p['read_bw'], p['write_bw'])
print(int(min(bw(s['peaks']) for s in v['servers'] if s['state'] == 'up')),
      int(max([bw(p['peaks']) for p in v['pools']] or [0])))")"
echo "one server: $((one / 1048576)) MiB/s; all $SERVERS at once: $((all / 1048576)) MiB/s (lower of read and write)"
for ask in $((one / 2)) $one $((one * 2)) $all; do
    for rep in $(seq "$REPS"); do
        printf '#!/bin/bash\n#SURGE jobdw bandwidth=%sMiB/s\ntrue\n' $((ask / 1048576)) > job.sh
        rm -f r.json
        $S run -q --measure-targets --report r.json job.sh 2> err.txt || true
        python3 - "$((ask / 1048576))" <<'EOF'
import json, sys
ask = sys.argv[1]
try:
    r = json.load(open("r.json"))
except Exception:
    r = {}
t = r.get("targets")
if not t or "measured" not in t:
    err = open("err.txt").read().strip().splitlines()
    e = err[-1] if err else "?"
    print(f"  asked {ask} MiB/s: refused: {e[e.find('cannot meet'):][:400]}")
    sys.exit()
m, o = t["measured"], t["offer"]
g = 1 << 30
p = m["promised_bytes_per_s"]
print(f"  asked {ask} MiB/s: {o['fragments']} fragment(s), promised {p/g:.2f} GiB/s; measured "
      f"write {m['write_bytes_per_s']/g:.2f} GiB/s ({m['write_bytes_per_s']/p:.2f}), read "
      f"{m['read_bytes_per_s']/g:.2f} GiB/s ({m['read_bytes_per_s']/p:.2f}), {m['procs']} procs")
EOF
    done
done
