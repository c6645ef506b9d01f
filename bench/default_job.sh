#!/usr/bin/env bash
# What a plain `surge run` job gets (issue 17's bars), against, in the same run:
#   raw  - the fast-tier directory itself (/dev/shm): the limit;
#   job  - fio inside a default job instance (`#DW jobdw type=scratch access_mode=striped
#          capacity=4GiB`: 16 fragments over the embedded default's 4 servers), run by the
#          user who runs this script (root: kernel passthrough; see --user);
#   pll  - libfuse's passthrough_ll over a /dev/shm directory (the N-1 bar: >= 1.0 of it).
# Tests (fio, psync):
#   seqwrite / seqread  8 MiB, 2 processes, file per process, SIZE each (bar: >= 0.9 of raw)
#   n1write             8 MiB, 2 processes into one shared file (N-1; bar: >= 1.0 of pll)
#   randread4k-1/-2, randwrite4k-1/-2   4 KiB random, 1 and 2 processes, RANDSIZE per file,
#                       RUNTIME s (bar: >= 0.5 of raw)
#   randwrite4k-fsync   4 KiB random writes, each followed by fsync, 1 process, RANDSIZE file,
#                       RUNTIME s (issue 34's bar: >= 0.5 of pll)
# Sides alternate their order from run to run (the first writes into fresh memory are slow
# on this VM and would bias whichever side goes first). Prints each run and the medians, and
# the ratios job/raw (and job/pll, per run too, for the tests run on pll).
#
#   bench/default_job.sh [--runs 3] [--size 1G] [--randsize 256M] [--runtime 4]
#                        [--user NAME]   run the job as NAME (made if missing): the non-root
#                                        path, every byte through the daemon unless a
#                                        passthrough helper runs (see --helper)
#                        [--helper]      start `surge passthrough-helper` (root) for the run
#                                        on a socket of its own: a user's job gets kernel
#                                        passthrough (without it: none, whatever runs on the
#                                        host's default socket)
#                        [--layout L]    the job first sets L as the default layout of its
#                                        instance's root (surge layout set), e.g.
#                                        stripe_count=all for DataWarp's striping
#                        [--tests "T ..."]  only these tests (names above), e.g.
#                                        --tests randwrite4k-fsync
#                        [--json FILE]
# Needs root (FUSE mounts), fio, gcc and libfuse3-dev (scripts/setup.sh).
# SURGE=path/to/surge (default target/release/surge, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=3 SIZE=1G RANDSIZE=256M RUNTIME=4 AS_USER="" LAYOUT="" JSON="" HELPER=0 ONLY=""
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --size) SIZE=$2; shift 2 ;;
        --randsize) RANDSIZE=$2; shift 2 ;;
        --runtime) RUNTIME=$2; shift 2 ;;
        --user) AS_USER=$2; shift 2 ;;
        --layout) LAYOUT=$2; shift 2 ;;
        --helper) HELPER=1; shift ;;
        --json) JSON=$2; shift 2 ;;
        --tests) ONLY=$2; shift 2 ;;
        -h|--help) sed -n "2,/^# SURGE=/p" "$0" | sed "s/^# \{0,1\}//"; exit 0 ;;
        *) echo "default_job.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "default_job.sh: run as root (FUSE mounts, --user)" >&2; exit 2; }
SURGE=${SURGE:-target/release/surge}
[ -x "$SURGE" ] || cargo build --release -p surge-cli
SURGE=$(realpath "$SURGE")
for tool in fio gcc pkg-config python3; do
    command -v $tool >/dev/null || { echo "default_job.sh: $tool is missing (scripts/setup.sh)" >&2; exit 2; }
done

WORK=$(mktemp -d /tmp/surge-default-job.XXXXXX)
chmod 755 "$WORK"
SHM=$(mktemp -d /dev/shm/surge-default-job.XXXXXX)
PLL_PID="" HELPER_PID=""
cleanup() {
    [ -n "$HELPER_PID" ] && kill "$HELPER_PID" 2>/dev/null || true
    [ -n "$PLL_PID" ] && { fusermount3 -u "$WORK/pll" 2>/dev/null || umount -l "$WORK/pll" 2>/dev/null; kill "$PLL_PID" 2>/dev/null; } || true
    rm -rf "$WORK" "$SHM"
}
trap cleanup EXIT INT TERM

gcc -O2 -o "$WORK/passthrough_ll" /usr/share/doc/libfuse3-dev/examples/passthrough_ll.c \
    $(pkg-config --cflags --libs fuse3) -lpthread 2>"$WORK/pll-build.log" \
    || { echo "cannot build passthrough_ll:" >&2; cat "$WORK/pll-build.log" >&2; exit 1; }
mkdir -p "$SHM/raw" "$SHM/pll-src" "$WORK/pll"
"$WORK/passthrough_ll" -o source="$SHM/pll-src" "$WORK/pll" &
PLL_PID=$!
for _ in $(seq 100); do mountpoint -q "$WORK/pll" && break; sleep 0.05; done
mountpoint -q "$WORK/pll" || { echo "passthrough_ll did not mount" >&2; exit 1; }

RUN_AS=()
if [ -n "$AS_USER" ]; then
    id "$AS_USER" >/dev/null 2>&1 || useradd --system --no-create-home "$AS_USER"
    RUN_AS=(runuser -u "$AS_USER" --)
    chown "$AS_USER" "$WORK"
    chmod 755 "$SHM"
    mkdir -p "$SHM/fast" && chown "$AS_USER" "$SHM/fast"
fi

# The tests, as fio arguments; each runs in an empty directory.
TESTS=(seqwrite seqread n1write randread4k-1 randread4k-2 randwrite4k-1 randwrite4k-2 randwrite4k-fsync)
# The tests also run on passthrough_ll, the price any FUSE design pays (their bars are against it).
PLL_TESTS=(n1write randwrite4k-fsync)
declare -A ARGS=(
    [seqwrite]="--rw=write --bs=8M --size=$SIZE --numjobs=2"
    [seqread]="--rw=read --bs=8M --size=$SIZE --numjobs=2"
    [n1write]="--rw=write --bs=8M --size=$SIZE --numjobs=2 --filename=shared --offset_increment=$SIZE"
    [randread4k-1]="--rw=randread --bs=4k --size=$RANDSIZE --numjobs=1 --time_based --runtime=$RUNTIME"
    [randread4k-2]="--rw=randread --bs=4k --size=$RANDSIZE --numjobs=2 --time_based --runtime=$RUNTIME"
    [randwrite4k-1]="--rw=randwrite --bs=4k --size=$RANDSIZE --numjobs=1 --time_based --runtime=$RUNTIME"
    [randwrite4k-2]="--rw=randwrite --bs=4k --size=$RANDSIZE --numjobs=2 --time_based --runtime=$RUNTIME"
    [randwrite4k-fsync]="--rw=randwrite --bs=4k --size=$RANDSIZE --numjobs=1 --fsync=1 --time_based --runtime=$RUNTIME"
)
if [ -n "$ONLY" ]; then
    for t in $ONLY; do
        [ -n "${ARGS[$t]:-}" ] || { echo "default_job.sh: no test '$t' (tests: ${TESTS[*]})" >&2; exit 2; }
    done
    [[ " $ONLY " == *" seqread "* && " $ONLY " != *" seqwrite "* ]] && ONLY="seqwrite $ONLY"
    keep=(); for t in "${TESTS[@]}"; do [[ " $ONLY " == *" $t "* ]] && keep+=("$t"); done; TESTS=("${keep[@]}")
    keep=(); for t in "${PLL_TESTS[@]}"; do [[ " $ONLY " == *" $t "* ]] && keep+=("$t"); done; PLL_TESTS=("${keep[@]}")
fi
# seqread reads what seqwrite wrote (same directory); the others start empty.
declare -A SAME_DIR=([seqread]=seqwrite)

# One side's tests: a script that runs every test in DIR/<test> and leaves OUT/<test>.json.
cat > "$WORK/tests.sh" <<EOF
#!/bin/bash
set -eu
DIR=\$1 OUT=\$2
$(for t in "${TESTS[@]}"; do
    d=${SAME_DIR[$t]:-$t}
    echo "mkdir -p \"\$DIR/$d\""
    echo "fio --name=$t --directory=\"\$DIR/$d\" --ioengine=psync --group_reporting --output-format=json ${ARGS[$t]} > \"\$OUT/$t.json\""
    # Each test's files go when it is done (seqwrite's after seqread has read them).
    case $t in seqwrite) ;; *) echo "rm -rf \"\$DIR/$d\"" ;; esac
done)
EOF
chmod 755 "$WORK/tests.sh"
cat > "$WORK/job.sh" <<EOF
#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=4GiB
$([ -n "$LAYOUT" ] && echo "setfattr -n user.surge.layout -v '$LAYOUT' \$DW_JOB_STRIPED")
"$WORK/tests.sh" "\$DW_JOB_STRIPED" "\$JOB_OUT"
EOF
chmod 755 "$WORK/job.sh"

# Bytes/s (bandwidth tests) or IOPS of a fio JSON output.
value() {
    python3 - "$1" "$2" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))["jobs"][0]
side = "write" if "write" in sys.argv[2] else "read"
print(d[side]["iops"] if "4k" in sys.argv[2] else d[side]["bw_bytes"] / 1048576)
EOF
}

RESULTS="$WORK/results"
: > "$RESULTS"
side_raw() {
    local out=$WORK/out-raw; rm -rf "$out"; mkdir -p "$out"
    "$WORK/tests.sh" "$SHM/raw" "$out"
    for t in "${TESTS[@]}"; do echo "$1 raw $t $(value "$out/$t.json" $t)" >> "$RESULTS"; done
}
side_pll() {
    local out=$WORK/out-pll; rm -rf "$out"; mkdir -p "$out"
    local t
    for t in "${PLL_TESTS[@]}"; do
        mkdir -p "$WORK/pll/$t"
        fio --name=$t --directory="$WORK/pll/$t" --ioengine=psync --group_reporting \
            --output-format=json ${ARGS[$t]} > "$out/$t.json"
        rm -rf "$WORK/pll/$t"
        echo "$1 pll $t $(value "$out/$t.json" $t)" >> "$RESULTS"
    done
}
side_job() {
    local out=$WORK/out-job; rm -rf "$out"; mkdir -p "$out"; chmod 777 "$out"
    local env=(SURGE_FAST_DIR="$SHM/fast" SURGE_STATE_DIR="$WORK/state-${AS_USER:-root}" JOB_OUT="$out"
               SURGE_PASSTHROUGH_SOCKET="$WORK/passthrough.sock")
    if ! (cd "$WORK" && "${RUN_AS[@]}" env "${env[@]}" "$SURGE" run "$WORK/job.sh" > "$WORK/job-$1.log" 2>&1); then
        echo "the job failed; its output:" >&2; cat "$WORK/job-$1.log" >&2; exit 1
    fi
    for t in "${TESTS[@]}"; do echo "$1 job $t $(value "$out/$t.json" $t)" >> "$RESULTS"; done
}

if [ "$HELPER" -eq 1 ]; then
    "$SURGE" passthrough-helper --socket "$WORK/passthrough.sock" --ready-file "$WORK/helper.ready" \
        2> "$WORK/helper.log" &
    HELPER_PID=$!
    for _ in $(seq 100); do [ -s "$WORK/helper.ready" ] && break; sleep 0.05; done
    [ -s "$WORK/helper.ready" ] || { echo "the passthrough helper did not start:" >&2; cat "$WORK/helper.log" >&2; exit 1; }
fi

for run in $(seq "$RUNS"); do
    if [ $((run % 2)) -eq 1 ]; then order=(raw pll job); else order=(job pll raw); fi
    for side in "${order[@]}"; do "side_$side" "$run"; done
    echo "run $run ($(IFS=,; echo "${order[*]}")) done" >&2
done

python3 - "$RESULTS" "$RUNS" "${AS_USER:-root}$([ "$HELPER" -eq 1 ] && echo ' + passthrough helper')" "${LAYOUT:-auto}" "$JSON" <<'EOF'
import json, statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
runs, user, layout, out = int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
v = {}
for run, side, test, val in rows:
    v.setdefault((side, test), {})[int(run)] = float(val)
tests = []
for r in rows:
    if r[2] not in tests:
        tests.append(r[2])
def med(side, t):
    d = v.get((side, t))
    return statistics.median(d.values()) if d else None
print(f"\ndefault job (user {user}, mount --layout {layout}) vs raw /dev/shm; MiB/s, IOPS for 4k; {runs} runs")
print(f"{'test':15} {'raw':>10} {'job':>10} {'pll':>10} {'job/raw':>8} {'job/pll':>8}   per run job/raw")
summary = {}
for t in tests:
    raw, job, pll = med("raw", t), med("job", t), med("pll", t)
    per = [v[("job", t)][r] / v[("raw", t)][r] for r in sorted(v[("job", t)]) if r in v.get(("raw", t), {})]
    per_pll = [v[("job", t)][r] / v[("pll", t)][r] for r in sorted(v[("job", t)]) if r in v.get(("pll", t), {})]
    jr = job / raw if raw else None
    jp = job / pll if pll else None
    summary[t] = {"raw": raw, "job": job, "pll": pll, "job_raw": jr, "job_pll": jp, "per_run_job_raw": per,
                  "per_run_job_pll": per_pll}
    print(f"{t:15} {raw:10.0f} {job:10.0f} {pll if pll else float('nan'):10.0f} {jr:8.2f} "
          f"{jp if jp else float('nan'):8.2f}   {' '.join(f'{x:.2f}' for x in per)}"
          + (f"   (job/pll: {' '.join(f'{x:.2f}' for x in per_pll)})" if per_pll else ""))
if out:
    json.dump({"user": user, "layout": layout, "runs": runs, "tests": summary}, open(out, "w"), indent=1)
EOF
