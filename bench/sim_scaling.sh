#!/usr/bin/env bash
# How fast `surge sim` runs, and how that grows with the machine: the largest shipped example
# (Liu et al. §IV-B: PlasmaPhysics + AstroPhysics + Turbulence1 on 32K compute nodes and 512
# I/O nodes with burst buffers, 5 simulated hours) at 1/16, 1/8, 1/4, 1/2 and full size.
# Node, I/O-node and file-server counts shrink together, so events scale with the machine.
#
# Prints, per scale, the median over --runs of wall time and events/s, and ratios against the
# smallest scale measured in the same run (wall-clock numbers on a shared machine are noisy;
# the ratios are what to compare between machines).
#
#   bench/sim_scaling.sh [--runs N] [--scales "0.0625 0.125 0.25 0.5 1"] [--no-bb]
set -euo pipefail
cd "$(dirname "$0")/.."

runs=3
scales="0.0625 0.125 0.25 0.5 1"
bb=true
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs=$2; shift 2 ;;
        --scales) scales=$2; shift 2 ;;
        --no-bb) bb=false; shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done

SURGE=${SURGE:-${CARGO_TARGET_DIR:-target}/release/surge}
if [ ! -x "$SURGE" ]; then
    echo "building $SURGE (cargo build --release -p surge-cli)" >&2
    cargo build --release -q -p surge-cli
fi
K=examples/sim/kernels

field() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" | head -1; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

printf "%-7s %7s %6s %8s %11s %10s %12s %9s %9s %9s\n" \
    scale nodes ions servers events wall_s "M events/s" "x events" "x wall" "x rate"
base_events=""; base_wall=""; base_rate=""
for s in $scales; do
    nodes=$(awk -v s="$s" 'BEGIN {printf "%d", 32768*s + 0.5}')
    half=$(awk -v s="$s" 'BEGIN {printf "%d", 16384*s + 0.5}')
    quarter=$(awk -v s="$s" 'BEGIN {printf "%d", 8192*s + 0.5}')
    servers=$(awk -v s="$s" 'BEGIN {n = int(128*s + 0.5); print (n < 1 ? 1 : n)}')
    racks=$(awk -v s="$s" -v f="$servers" 'BEGIN {n = int(16*s + 0.5); if (n < 1) n = 1; if (n > f) n = f; print n}')
    walls=(); rates=(); events=0
    for _ in $(seq "$runs"); do
        # Each kernel file gets its own node count through a per-file copy of the param.
        json=$("$SURGE" sim run examples/sim/systems/intrepid-32k.toml \
            <(sed "s/^param nodes = .*/param nodes = $half/" $K/plasma.kernel) \
            <(sed "s/^param nodes = .*/param nodes = $quarter/" $K/astro.kernel) \
            <(sed "s/^param nodes = .*/param nodes = $quarter/" $K/turbulence1.kernel) \
            --set compute.nodes="$nodes" --set file_servers.count="$servers" \
            --set storage.racks="$racks" --set burst_buffer.enabled=$bb --until 5h --json)
        events=$(echo "$json" | field events)
        walls+=("$(echo "$json" | field wall_s)")
        rates+=("$(echo "$json" | field events_per_s)")
    done
    wall=$(printf "%s\n" "${walls[@]}" | median)
    rate=$(printf "%s\n" "${rates[@]}" | median)
    if [ -z "$base_events" ]; then base_events=$events; base_wall=$wall; base_rate=$rate; fi
    awk -v s="$s" -v n="$nodes" -v f="$servers" -v e="$events" -v w="$wall" -v r="$rate" \
        -v be="$base_events" -v bw="$base_wall" -v br="$base_rate" 'BEGIN {
        printf "%-7s %7d %6d %8d %11d %10.2f %12.2f %9.2f %9.2f %9.2f\n",
            s, n, n/64, f, e, w, r/1e6, e/be, w/bw, r/br }'
done
