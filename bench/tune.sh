#!/usr/bin/env bash
# `surge tune` benchmark (issue 18): for two workloads, on this machine (fast tier /dev/shm,
# the local disk as the PFS),
#   1. the exhaustive sweep of the space (`surge tune --exhaustive --fresh`): runs and best;
#   2. the search (`surge tune --fresh`): runs needed and the configuration it picks;
#   3. the same search again, with the history: new runs;
#   4. the tuned script vs the job as written (default #DW jobdw) vs the PFS only vs the sweep's
#      pick, each run REPS times in alternating order by `surge run`; medians of stage in + job +
#      stage out, and ratios (>1: tuned is faster).
# Workloads: mpiio - examples/tune/mpiio-checkpoint.sh (4 MPI ranks, collective writes and reads
# of a 64 MiB shared file, staged out); camp - the CAMP-like builddb of examples/workflows with
# its package directories and geometa staged in and the database staged out.
#
# Usage: bench/tune.sh [--reps N] [--workloads mpiio,camp] [--workdir DIR]
# Needs root (FUSE), Open MPI and python3; builds the release binary if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
REPS=5 WORKLOADS=mpiio,camp WORK=/tmp/surge-bench-tune
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) REPS=$2; shift 2 ;;
        --workloads) WORKLOADS=$2; shift 2 ;;
        --workdir) WORK=$2; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
[ -x target/release/surge ] || cargo build --release -p surge-cli
export SURGE=$REPO/target/release/surge
export SURGE_FAST_DIR=/dev/shm/surge-bench-tune SURGE_SERVERS=4 SURGE_SERVER_CAPACITY=1GiB
export SURGE_GRANULARITY=256MiB
unset SURGE_MANAGER
rm -rf "$WORK" && mkdir -p "$WORK"
export SURGE_TUNE_DB=$WORK/tune.db

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
objective() { # report.json -> stage in + job + stage out seconds (empty if it failed)
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))
if r["exit_code"]==0: print(sum(p["seconds"] for p in r["phases"] if p["name"] in ("stage in","job","stage out")))' "$1"
}

prepare_mpiio() {
    cp "$REPO/examples/tune/mpiio-checkpoint.sh" job.sh
    echo "&run n=1 /" > params.nml
}
prepare_camp() {
    python3 "$REPO/examples/workflows/camp/builddb.py" prepare camp > /dev/null
    cat > job.sh <<EOF
#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=256MiB
#DW stage_in type=directory source=camp/env destination=\$DW_JOB_STRIPED/env
#DW stage_in type=directory source=camp/geometa destination=\$DW_JOB_STRIPED/geometa
#DW stage_out type=file source=\$DW_JOB_STRIPED/camp.db destination=camp-out/camp.db
set -e
python3 $REPO/examples/workflows/camp/builddb.py run \$DW_JOB_STRIPED > /dev/null
EOF
}

for w in ${WORKLOADS//,/ }; do
    dir=$WORK/$w && mkdir -p "$dir" && cd "$dir"
    "prepare_$w"
    echo "== $w"
    # The sweep has its own history: the search's second call must see only the search's runs.
    $SURGE tune job.sh --exhaustive --fresh --runs 500 --max-fragments 4 --json \
        --history "$WORK/exhaustive-$w.db" --out exhaustive.sh \
        --workdir "$dir/exhaustive" --keep -q > exhaustive.json
    $SURGE tune job.sh --fresh --runs 100 --max-fragments 4 --json -q > search.json
    $SURGE tune job.sh --runs 100 --max-fragments 4 --json -q > again.json
    python3 - <<'EOF'
import json
ex, s, a = (json.load(open(f)) for f in ("exhaustive.json", "search.json", "again.json"))
print(f"  space: {ex['space_size']} configurations; exhaustive: {ex['new_runs']} runs, best {ex['best']['key']} ({ex['best']['median_s']:.3f} s)")
rank = [t['key'] for t in ex['tried'] if t['median_s'] is not None]
pos = rank.index(s['best']['key']) + 1 if s['best']['key'] in rank else None
print(f"  search: {s['new_runs']} runs ({s['new_runs']/ex['new_runs']:.2f} of exhaustive), best {s['best']['key']} ({s['best']['median_s']:.3f} s); rank of its pick in the exhaustive sweep: {pos} of {len(rank)}")
print(f"  second call: {a['new_runs']} new runs, {a['reused_runs']} from the history, best {a['best']['key']}")
EOF
    # 4. tuned vs as written vs PFS only, alternating order.
    pfs=$(grep -l "# surge tune: run [0-9]*: pfs-only" exhaustive/run-*.sh | head -1)
    cp "$pfs" pfs-only.sh
    cp job.tuned.sh tuned.sh
    : > times.txt
    for i in $(seq 1 "$REPS"); do
        if [ $((i % 2)) -eq 1 ]; then order="job tuned pfs-only exhaustive"; else order="exhaustive pfs-only tuned job"; fi
        for v in $order; do
            rm -rf .surge-tune-pfs
            $SURGE run --quiet --report r.json "$v.sh" > /dev/null 2>&1 || true
            echo "$v $(objective r.json)" >> times.txt
        done
    done
    rm -rf .surge-tune-pfs
    for v in job tuned pfs-only exhaustive; do
        echo "$v $(awk -v v=$v '$1==v && NF==2 {print $2}' times.txt | median)"
    done > medians.txt
    awk '{m[$1]=$2} END {
        printf "  %d runs each, alternating; median stage in + job + stage out:\n", '"$REPS"';
        printf "    as written %.3f s, tuned %.3f s, PFS only %.3f s, sweep pick %.3f s\n", m["job"], m["tuned"], m["pfs-only"], m["exhaustive"];
        printf "    tuned vs as written %.2fx, tuned vs PFS only %.2fx, tuned vs sweep pick %.2fx\n", m["job"]/m["tuned"], m["pfs-only"]/m["tuned"], m["exhaustive"]/m["tuned"] }' medians.txt
    cd "$REPO"
done
