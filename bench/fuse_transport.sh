#!/usr/bin/env bash
# Surge's FUSE transports side by side (issue 34, item 1): the same workloads on a Surge job
# mount served over FUSE-over-io_uring (`uring`) and over /dev/fuse (`dev`,
# SURGE_FUSE_TRANSPORT=dev-fuse), and on the raw fast tier (`raw`, a /dev/shm directory), in
# one run, sides alternating from run to run, several runs, medians and ratios.
# Two instance kinds, each a `surge run` job as root (`#DW jobdw type=scratch
# access_mode=striped capacity=4GiB`, the embedded default's 4 servers):
#   job     - the default job instance: new files are one local stripe, read and written by
#             the kernel (passthrough); metadata still goes to the daemon;
#   striped - the same job with `stripe_count=all` set on its root (surge layout set), so
#             files are striped over every fragment, never passed through: every read and
#             write reaches the daemon and its servers.
# Workloads: create/stat/unlink of 10k empty files with 1 and 2 processes (bench/md.c);
# fio psync 4 KiB random read and write with 1 and 2 jobs (RANDSIZE per file, RUNTIME s);
# 8 MiB sequential write then read with 2 jobs (SIZE per file).
# The first writes into fresh memory are slow on this VM: one warm-up pass of every side
# runs first and is not counted.
#
#   bench/fuse_transport.sh [--runs 3] [--size 512M] [--randsize 128M] [--runtime 3]
#                           [--files 10000] [--kinds job,striped] [--json FILE]
#                           [--replier-commits]  (also uringr: see below)
# Needs root, fio, gcc, python3, and a kernel with FUSE over io_uring (Linux >= 6.14): the
# script sets /sys/module/fuse/parameters/enable_uring to Y for the run and restores it.
# SURGE=path/to/surge (default target/release/surge, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=3 SIZE=512M RANDSIZE=128M RUNTIME=3 FILES=10000 KINDS=job,striped JSON="" REPLIER=0
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --size) SIZE=$2; shift 2 ;;
        --randsize) RANDSIZE=$2; shift 2 ;;
        --runtime) RUNTIME=$2; shift 2 ;;
        --files) FILES=$2; shift 2 ;;
        --kinds) KINDS=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        --replier-commits) REPLIER=1; shift ;;
        -h|--help) sed -n 2,25p "$0"; exit 0 ;;
        *) echo "fuse_transport.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "fuse_transport.sh: run as root (FUSE mounts)" >&2; exit 2; }
PARAM=/sys/module/fuse/parameters/enable_uring
[ -w "$PARAM" ] || { echo "fuse_transport.sh: no $PARAM (FUSE over io_uring needs Linux >= 6.14)" >&2; exit 2; }
for tool in fio gcc python3; do
    command -v $tool >/dev/null || { echo "fuse_transport.sh: $tool is missing (scripts/setup.sh)" >&2; exit 2; }
done
SURGE=${SURGE:-target/release/surge}
[ -x "$SURGE" ] || cargo build --release -p surge-cli
SURGE=$(realpath "$SURGE")

WORK=$(mktemp -d /tmp/surge-fuse-transport.XXXXXX)
chmod 755 "$WORK"
SHM=$(mktemp -d /dev/shm/surge-fuse-transport.XXXXXX)
WAS=$(cat "$PARAM")
MUNGED_PID=""
cleanup() {
    echo "$WAS" > "$PARAM" 2>/dev/null || true
    [ -n "$MUNGED_PID" ] && { kill "$MUNGED_PID" 2>/dev/null; wait "$MUNGED_PID" 2>/dev/null; } || true
    rm -rf "$WORK" "$SHM"
}
trap cleanup EXIT INT TERM
echo Y > "$PARAM"
# A munged of this run (the jobs' manager authenticates its clients with MUNGE), so that the
# host's, which other work on a shared machine may stop, does not matter.
mkdir -m 700 "$WORK/munge"
mungekey --create --keyfile="$WORK/munge/munge.key" >/dev/null
munged --foreground --force --socket="$WORK/munge/munge.socket" --key-file="$WORK/munge/munge.key" \
    --pid-file="$WORK/munge/munged.pid" --log-file="$WORK/munge/munged.log" \
    --seed-file="$WORK/munge/munged.seed" &
MUNGED_PID=$!
for _ in $(seq 100); do [ -S "$WORK/munge/munge.socket" ] && break; sleep 0.05; done
export SURGE_MUNGE_SOCKET=$WORK/munge/munge.socket
gcc -O2 -o "$WORK/md" bench/md.c

TESTS=(create-1 stat-1 unlink-1 create-2 stat-2 unlink-2 randread4k-1 randread4k-2
       randwrite4k-1 randwrite4k-2 seqwrite seqread)
# One side's tests: DIR OUT -> OUT/<test> holds one number (ops/s, IOPS or MiB/s).
cat > "$WORK/tests.sh" <<EOF
#!/bin/bash
set -eu
DIR=\$1 OUT=\$2
val() { python3 -c "import json,sys; j=json.load(open(sys.argv[1]))['jobs'][0][sys.argv[2]]; print(j['iops'] if sys.argv[3]=='iops' else j['bw_bytes']/1048576)" "\$@"; }
for p in 1 2; do
    mkdir -p "\$DIR/md"
    "$WORK/md" "\$DIR/md" $FILES \$p > "\$OUT/md.txt"
    for ph in create stat unlink; do awk -v ph=\$ph '\$1==ph {print \$2}' "\$OUT/md.txt" > "\$OUT/\$ph-\$p"; done
    rm -rf "\$DIR/md"
done
for n in 1 2; do
    for rw in randread randwrite; do
        mkdir -p "\$DIR/r4k"
        fio --name=r4k --directory="\$DIR/r4k" --ioengine=psync --group_reporting --output-format=json \
            --rw=\$rw --bs=4k --size=$RANDSIZE --numjobs=\$n --time_based --runtime=$RUNTIME > "\$OUT/r.json"
        side=read; [ \$rw = randwrite ] && side=write
        val "\$OUT/r.json" \$side iops > "\$OUT/\${rw}4k-\$n"
        rm -rf "\$DIR/r4k"
    done
done
mkdir -p "\$DIR/seq"
fio --name=seq --directory="\$DIR/seq" --ioengine=psync --group_reporting --output-format=json \
    --rw=write --bs=8M --size=$SIZE --numjobs=2 > "\$OUT/s.json"
val "\$OUT/s.json" write bw > "\$OUT/seqwrite"
fio --name=seq --directory="\$DIR/seq" --ioengine=psync --group_reporting --output-format=json \
    --rw=read --bs=8M --size=$SIZE --numjobs=2 > "\$OUT/s.json"
val "\$OUT/s.json" read bw > "\$OUT/seqread"
rm -rf "\$DIR/seq"
EOF
chmod 755 "$WORK/tests.sh"
for kind in job striped; do
    cat > "$WORK/$kind.sh" <<EOF
#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=4GiB
set -eu
$([ $kind = striped ] && echo "\"$SURGE\" layout set --stripe-count all \"\$DW_JOB_STRIPED\"")
"$WORK/tests.sh" "\$DW_JOB_STRIPED" "\$JOB_OUT"
EOF
    chmod 755 "$WORK/$kind.sh"
done

RESULTS=$WORK/results
: > "$RESULTS"
record() { # RUN SIDE OUTDIR
    for t in "${TESTS[@]}"; do echo "$1 $2 $t $(cat "$3/$t")" >> "$RESULTS"; done
}
side_raw() {
    local out=$WORK/out; rm -rf "$out"; mkdir -p "$out" "$SHM/raw"
    "$WORK/tests.sh" "$SHM/raw" "$out"
    record "$1" raw "$out"
}
side_surge() { # RUN KIND TRANSPORT(uring|uringr|dev)
    local out=$WORK/out; rm -rf "$out"; mkdir -p "$out"
    local t=auto commit=queue; [ "$3" = dev ] && t=dev-fuse; [ "$3" = uringr ] && commit=replier
    if ! (cd "$WORK" && env SURGE_FAST_DIR="$SHM/fast" SURGE_STATE_DIR="$WORK/state" JOB_OUT="$out" \
            SURGE_FUSE_TRANSPORT=$t SURGE_FUSE_URING_COMMIT=$commit RUST_LOG=info \
            "$SURGE" run "$WORK/$2.sh" > "$WORK/job.log" 2>&1); then
        echo "the $2 job ($3) failed; its output:" >&2; cat "$WORK/job.log" >&2; exit 1
    fi
    # The mount says which transport it got; a side that did not get what it is named for
    # would make the comparison a lie.
    local want="FUSE transport: io_uring"; [ "$3" = dev ] && want="FUSE transport: /dev/fuse"
    grep -q "$want" "$WORK/job.log" || { echo "the $2 job ($3) did not mount with $want:" >&2; cat "$WORK/job.log" >&2; exit 1; }
    grep -m1 "unmounted" "$WORK/job.log" | sed 's/.*unmounted [^:]*: /  '"$2-$3"': /' >&2
    record "$1" "$2-$3" "$out"
}
SIDES=(raw)
for k in ${KINDS//,/ }; do SIDES+=("$k-uring" "$k-dev"); done
# --replier-commits: also each kind over io_uring with replies committed by the replying
# thread (SURGE_FUSE_URING_COMMIT=replier, libfuse's way) instead of the queue's thread.
[ "$REPLIER" -eq 1 ] && for k in ${KINDS//,/ }; do SIDES+=("$k-uringr"); done
run_side() { # RUN SIDE
    case $2 in
        raw) side_raw "$1" ;;
        *) side_surge "$1" "${2%-*}" "${2##*-}" ;;
    esac
}
echo "warm-up (not counted): ${SIDES[*]}" >&2
for s in "${SIDES[@]}"; do run_side 0 "$s"; done
for run in $(seq "$RUNS"); do
    if [ $((run % 2)) -eq 1 ]; then order=("${SIDES[@]}"); else order=(); for ((i=${#SIDES[@]}-1; i>=0; i--)); do order+=("${SIDES[$i]}"); done; fi
    for s in "${order[@]}"; do run_side "$run" "$s"; done
    echo "run $run ($(IFS=,; echo "${order[*]}")) done" >&2
done

python3 - "$RESULTS" "$RUNS" "$KINDS" "$JSON" <<'EOF'
import json, statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
runs, kinds, out = int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
v = {}
for run, side, test, val in rows:
    if run != "0":
        v.setdefault((side, test), {})[int(run)] = float(val)
tests = []
for r in rows:
    if r[2] not in tests:
        tests.append(r[2])
med = lambda s, t: statistics.median(v[(s, t)].values()) if (s, t) in v else float("nan")
print(f"\nSurge mount over io_uring vs /dev/fuse vs raw /dev/shm; ops/s for md, IOPS for 4k, MiB/s for seq; medians of {runs} runs")
summary = {}
for k in kinds:
    rr = (f"{k}-uringr", tests[0]) in v
    print(f"\n{k}: {'test':13} {'raw':>10} {'uring':>10} {'dev':>10} {'ur/raw':>7} {'dev/raw':>7} {'ur/dev':>7}   per run ur/dev"
          + ("   uringr/dev" if rr else ""))
    for t in tests:
        raw, ur, dv = med("raw", t), med(f"{k}-uring", t), med(f"{k}-dev", t)
        per = [v[(f"{k}-uring", t)][r] / v[(f"{k}-dev", t)][r] for r in sorted(v.get((f"{k}-uring", t), {}))
               if r in v.get((f"{k}-dev", t), {}) and v[(f"{k}-dev", t)][r]]
        summary.setdefault(k, {})[t] = {"raw": raw, "uring": ur, "dev": dv, "per_run_uring_dev": per}
        extra = ""
        if rr:
            urr = med(f"{k}-uringr", t)
            summary[k][t]["uringr"] = urr
            extra = f"   {urr/dv:.2f}"
        print(f"{' ' * len(k)}  {t:13} {raw:10.0f} {ur:10.0f} {dv:10.0f} {ur/raw:7.2f} {dv/raw:7.2f} {ur/dv:7.2f}   "
              + " ".join(f"{x:.2f}" for x in per) + extra)
if out:
    json.dump({"runs": runs, "kinds": summary}, open(out, "w"), indent=1)
EOF
