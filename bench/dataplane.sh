#!/usr/bin/env bash
# Data-plane benchmark (issue 2): the Surge mount against, in the same run,
#   raw  - the fast-tier directory itself (/dev/shm), the limit;
#   pll  - libfuse's passthrough_ll over a /dev/shm directory, the price any FUSE design pays;
#   surge - a Surge instance over local servers whose fast tier is /dev/shm.
# Tests: sequential 8 MiB write and read bandwidth, 4 KiB random read and write IOPS (fio,
# psync), at 1 and 2 streams; file create, stat and unlink rates (bench/md.c, 10k files per
# process). Each test is run REPS times and the median kept. Prints a table of medians and the
# ratios surge/raw, pll/raw and surge/pll.
#
# Usage: bench/dataplane.sh [--reps N] [--servers N] [--size MiB] [--files N] [--runtime S] [--json FILE]
# Needs root (FUSE mounts, dropping caches), fio, gcc and libfuse3-dev (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

REPS=3 SERVERS=2 SIZE_MB=1024 FILES=10000 RUNTIME=5 JSON=""
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) REPS=$2; shift 2 ;;
        --servers) SERVERS=$2; shift 2 ;;
        --size) SIZE_MB=$2; shift 2 ;;
        --files) FILES=$2; shift 2 ;;
        --runtime) RUNTIME=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "dataplane.sh: needs root (FUSE mounts)" >&2; exit 1; }
for c in fio gcc pkg-config; do command -v $c >/dev/null || { echo "missing $c: run scripts/setup.sh" >&2; exit 1; }; done

SURGE=target/release/surge
[ -x $SURGE ] || cargo build --release -p surge-cli
WORK=$(mktemp -d /tmp/surge-dataplane.XXXXXX)
SHM=/dev/shm/surge-dataplane-$$
mkdir -p "$SHM" "$WORK/bin"
PIDS=()
MOUNTS=()
cleanup() {
    set +e
    for m in "${MOUNTS[@]}"; do fusermount3 -u "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    sleep 0.5
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$SHM" "$WORK"
}
trap cleanup EXIT INT TERM

gcc -O2 -o "$WORK/bin/md" bench/md.c
gcc -O2 -Wall -o "$WORK/bin/passthrough_ll" /usr/share/doc/libfuse3-dev/examples/passthrough_ll.c \
    $(pkg-config --cflags --libs fuse3) -lpthread 2>"$WORK/pll-build.log" || {
    echo "cannot build passthrough_ll (see $WORK/pll-build.log)" >&2; cat "$WORK/pll-build.log" >&2; exit 1; }

# --- targets ---
mkdir -p "$SHM/raw" "$SHM/pll-src" "$WORK/pll" "$WORK/surge"
"$WORK/bin/passthrough_ll" -o source="$SHM/pll-src" "$WORK/pll" &
PIDS+=($!); MOUNTS+=("$WORK/pll")
ADDRS=()
for i in $(seq 1 "$SERVERS"); do
    $SURGE server --device "$SHM/bb$i" --capacity 16GiB --listen 127.0.0.1:0 --unix "$SHM/bb$i.sock" \
        --ready-file "$WORK/bb$i.ready" 2>"$WORK/bb$i.log" &
    PIDS+=($!)
done
for i in $(seq 1 "$SERVERS"); do
    for _ in $(seq 100); do [ -s "$WORK/bb$i.ready" ] && break; sleep 0.05; done
    ADDRS+=("$(python3 -c 'import json,sys; print([a for a in json.load(open(sys.argv[1]))["addrs"] if not a.startswith("unix:")][0])' "$WORK/bb$i.ready")")
done
ID=$($SURGE instance create --servers "$(IFS=,; echo "${ADDRS[*]}")" --capacity 16GiB --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["instance"])')
$SURGE mount --server "${ADDRS[0]}" --instance "$ID" --ready-file "$WORK/mnt.ready" "$WORK/surge" 2>"$WORK/mount.log" &
PIDS+=($!); MOUNTS+=("$WORK/surge")
for _ in $(seq 100); do [ -s "$WORK/mnt.ready" ] && mountpoint -q "$WORK/pll" && break; sleep 0.05; done
mountpoint -q "$WORK/surge" || { echo "surge mount failed:"; cat "$WORK/mount.log"; exit 1; }
mountpoint -q "$WORK/pll" || { echo "passthrough_ll mount failed"; exit 1; }

declare -A DIR=([raw]="$SHM/raw" [pll]="$WORK/pll" [surge]="$WORK/surge")
TARGETS=(raw pll surge)

# fio_run TARGET NAME RW BS JOBS -> prints MiB/s (bw tests) or IOPS
fio_run() {
    local t=$1 name=$2 rw=$3 bs=$4 jobs=$5 dir=${DIR[$1]}
    local per=$((SIZE_MB / jobs))
    local out="$WORK/fio-$t-$name.json"
    local extra=()
    case $rw in
        write) extra=(--size="${per}M") ;;
        read) extra=(--size="${per}M") ;;
        randread|randwrite) extra=(--size=256M --time_based --runtime="$RUNTIME") ;;
    esac
    # Reads: lay the files out first, then drop caches so they are read from the target.
    if [ "$rw" = read ] || [ "$rw" = randread ] || [ "$rw" = randwrite ]; then
        fio --name=lay --directory="$dir" --rw=write --bs=1M --numjobs="$jobs" --filename_format='f.$jobnum' \
            "${extra[@]}" --time_based=0 --runtime=0 --output-format=json >/dev/null
        sync; echo 3 >/proc/sys/vm/drop_caches
    fi
    fio --name="$name" --directory="$dir" --rw="$rw" --bs="$bs" --numjobs="$jobs" --ioengine=psync \
        --filename_format='f.$jobnum' --group_reporting --output-format=json "${extra[@]}" >"$out"
    rm -f "$dir"/f.*
    case $rw in
        write|read) python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print("%.0f" % ((j["read"]["bw_bytes"]+j["write"]["bw_bytes"])/1048576))' "$out" ;;
        *) python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print("%.0f" % (j["read"]["iops"]+j["write"]["iops"]))' "$out" ;;
    esac
}

md_run() { # TARGET PROCS -> "create stat unlink"
    "$WORK/bin/md" "${DIR[$1]}" "$((FILES / $2))" "$2" | awk '{printf "%s ", $2}'
}

TESTS=("seqwrite-1:write:8M:1" "seqwrite-2:write:8M:2" "seqread-1:read:8M:1" "seqread-2:read:8M:2"
       "randread4k-1:randread:4k:1" "randread4k-2:randread:4k:2" "randwrite4k-1:randwrite:4k:1" "randwrite4k-2:randwrite:4k:2")
declare -A R
# Warm up: first writes to fresh memory are slow on this VM.
for t in "${TARGETS[@]}"; do fio_run "$t" warm write 8M 1 >/dev/null; done
for rep in $(seq 1 "$REPS"); do
    for spec in "${TESTS[@]}"; do
        IFS=: read -r name rw bs jobs <<<"$spec"
        for t in "${TARGETS[@]}"; do
            v=$(fio_run "$t" "$name" "$rw" "$bs" "$jobs")
            R[$t,$name]="${R[$t,$name]:-} $v"
        done
        echo "rep $rep $name: raw ${R[raw,$name]##* } pll ${R[pll,$name]##* } surge ${R[surge,$name]##* }" >&2
    done
    for procs in 1 2; do
        for t in "${TARGETS[@]}"; do
            read -r c s u <<<"$(md_run "$t" "$procs")"
            R[$t,create-$procs]="${R[$t,create-$procs]:-} $c"
            R[$t,stat-$procs]="${R[$t,stat-$procs]:-} $s"
            R[$t,unlink-$procs]="${R[$t,unlink-$procs]:-} $u"
        done
        echo "rep $rep metadata-$procs: raw ${R[raw,create-$procs]##* }/${R[raw,stat-$procs]##* }/${R[raw,unlink-$procs]##* }" \
             "pll ${R[pll,create-$procs]##* }/${R[pll,stat-$procs]##* }/${R[pll,unlink-$procs]##* }" \
             "surge ${R[surge,create-$procs]##* }/${R[surge,stat-$procs]##* }/${R[surge,unlink-$procs]##* }" >&2
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ROWS=(seqwrite-1 seqwrite-2 seqread-1 seqread-2 randread4k-1 randread4k-2 randwrite4k-1 randwrite4k-2
      create-1 create-2 stat-1 stat-2 unlink-1 unlink-2)
printf '\n%-15s %10s %10s %10s %10s %10s %10s\n' test raw pll surge surge/raw pll/raw surge/pll
JS="{\"servers\": $SERVERS, \"reps\": $REPS, \"results\": {"
first=1
for row in "${ROWS[@]}"; do
    raw=$(echo "${R[raw,$row]}" | median); pll=$(echo "${R[pll,$row]}" | median); sg=$(echo "${R[surge,$row]}" | median)
    unit=$([[ $row == seq* ]] && echo MiB/s || echo ops/s)
    printf '%-15s %10s %10s %10s %10.2f %10.2f %10.2f  %s\n' "$row" "$raw" "$pll" "$sg" \
        "$(echo "$sg/$raw" | bc -l)" "$(echo "$pll/$raw" | bc -l)" "$(echo "$sg/$pll" | bc -l)" "$unit"
    [ $first -eq 1 ] || JS+=", "; first=0
    JS+="\"$row\": {\"unit\": \"$unit\", \"raw\": $raw, \"pll\": $pll, \"surge\": $sg}"
done
JS+="}}"
[ -z "$JSON" ] || echo "$JS" >"$JSON"
