#!/usr/bin/env bash
# fio and `surge bench io` side by side, same access pattern, same sizes, same process count:
# the instrument check of issue 4. Both tools must agree within 15% for sequential 8 MiB and
# random 4 KiB transfers at 1 and 2 processes, and at 4 KiB on /dev/shm surge must reach at
# least 85% of fio's IOPS (its own overhead must not be what it measures).
#
# Usage: bench/fio_vs_surge.sh [ROUNDS]       (default 5 rounds; medians are compared)
# Env:   SURGE=path/to/surge (default: release build, built if missing)
#        TARGETS="/dev/shm /tmp"  PROCS="1 2"  RAW=file (keep every measurement)
#        SHM_SEQ=2g SHM_RAND=1g DISK_SEQ=1g DISK_RAND=256m DISK_SECS=8
#
# On /dev/shm both tools use buffered I/O (the page cache is the storage). On a disk both use
# O_DIRECT, so neither measures the page cache. The machine may be shared: the rounds
# interleave fio and surge so that load affects both alike; read the ratios, not the absolutes.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${1:-5}
TARGETS=${TARGETS:-"/dev/shm /tmp"}
PROCS=${PROCS:-"1 2"}
SHM_SEQ=${SHM_SEQ:-2g}
SHM_RAND=${SHM_RAND:-1g}
DISK_SEQ=${DISK_SEQ:-1g}
DISK_RAND=${DISK_RAND:-256m}
DISK_SECS=${DISK_SECS:-8}

for tool in fio jq awk; do
    command -v "$tool" >/dev/null || { echo "fio_vs_surge: '$tool' is missing (scripts/setup.sh installs fio; apt-get install jq)" >&2; exit 2; }
done
TARGET_DIR=${CARGO_TARGET_DIR:-target}
SURGE=${SURGE:-$TARGET_DIR/release/surge}
if [ ! -x "$SURGE" ]; then
    echo "fio_vs_surge: building $SURGE" >&2
    cargo build --release -p surge-cli >&2
fi

WORK=()
cleanup() { for d in "${WORK[@]}"; do rm -rf "$d"; done; }
trap cleanup EXIT INT TERM

# fio's size suffixes are powers of two (k, m, g), like surge's K, M, G.
to_surge_size() { echo "$1" | tr 'kmg' 'KMG'; }

# run_fio DIR RW BS SIZE PROCS DIRECT SECS -> prints "bytes_per_s iops"
run_fio() {
    local dir=$1 rw=$2 bs=$3 size=$4 procs=$5 direct=$6 secs=$7 name=$8
    local extra=()
    [ "$secs" != 0 ] && extra+=(--runtime="$secs")
    local out
    out=$(fio --name="$name" --directory="$dir" --rw="$rw" --bs="$bs" --size="$size" \
        --numjobs="$procs" --ioengine=psync --direct="$direct" --fallocate=none \
        --group_reporting --output-format=json "${extra[@]}")
    local side=read
    case $rw in write|randwrite) side=write ;; esac
    echo "$out" | jq -r ".jobs[0].$side | \"\(.bw_bytes) \(.iops) \(.bw_bytes) \(.iops)\""
}

# run_surge DIR PHASE BS SIZE PROCS DIRECT SECS RANDOM -> prints "bytes_per_s iops" as IOR
# rates them (first start to last end), then the same rated as fio does (by the slowest
# process's own time).
run_surge() {
    local dir=$1 phase=$2 bs=$3 size=$4 procs=$5 direct=$6 secs=$7 random=$8
    local args=(bench io "$dir" --transfer "$(to_surge_size "$bs")" --block "$(to_surge_size "$size")"
        --procs "$procs" --json)
    [ "$phase" = write ] && args+=(--write-only) || args+=(--read-only)
    [ "$direct" = 1 ] && args+=(--direct)
    [ "$random" = 1 ] && args+=(--random)
    [ "$secs" != 0 ] && args+=(--deadline "$secs")
    "$SURGE" "${args[@]}" | jq -r ".results[] | select(.phase==\"$phase\") |
        \"\(.bytes_per_s) \(.ops_per_s) \(.bytes / .slowest_rank_s) \(.ops / .slowest_rank_s)\""
}

median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# Every measurement, one line each (RAW=file keeps it):
#   target test procs tool bytes_per_s iops bytes_per_s_fio_way iops_fio_way
RESULTS=${RAW:-$(mktemp)}
[ -n "${RAW:-}" ] && : >"$RESULTS" || WORK+=("$RESULTS")

for target in $TARGETS; do
    if [ ! -d "$target" ] || [ ! -w "$target" ]; then
        echo "fio_vs_surge: skipping $target (not a writable directory)" >&2
        continue
    fi
    fstype=$(stat -f -c %T "$target")
    if [ "$fstype" = tmpfs ]; then
        direct=0; seq=$SHM_SEQ; rand=$SHM_RAND; secs=0
    else
        direct=1; seq=$DISK_SEQ; rand=$DISK_RAND; secs=$DISK_SECS
    fi
    for procs in $PROCS; do
        for round in $(seq 1 "$ROUNDS"); do
            for test in seq-write-8MiB seq-read-8MiB rand-write-4KiB rand-read-4KiB; do
                case $test in
                    seq-write-*) rw=write; phase=write; bs=8m; size=$seq; t=0; random=0 ;;
                    seq-read-*) rw=read; phase=read; bs=8m; size=$seq; t=0; random=0 ;;
                    rand-write-*) rw=randwrite; phase=write; bs=4k; size=$rand; t=$secs; random=1 ;;
                    rand-read-*) rw=randread; phase=read; bs=4k; size=$rand; t=$secs; random=1 ;;
                esac
                # fio and surge back to back, alternating who goes first, so that load from
                # other work on the machine falls on both alike.
                for tool in $([ $((round % 2)) = 1 ] && echo "fio surge" || echo "surge fio"); do
                    if [ "$tool" = fio ]; then
                        # A read job lays its files out first, untimed, like surge --read-only.
                        d=$(mktemp -d "$target/fio-vs-surge.XXXXXX"); WORK+=("$d")
                        r=$(run_fio "$d" "$rw" "$bs" "$size" "$procs" "$direct" "$t" job)
                        rm -rf "$d"
                    else
                        r=$(run_surge "$target" "$phase" "$bs" "$size" "$procs" "$direct" "$t" "$random")
                    fi
                    echo "$target $test $procs $tool $r" >>"$RESULTS"
                done
            done
        done
    done
done

printf "\nfio %s vs surge bench io (%s rounds, medians; ratio = surge / fio)\n" "$(fio --version)" "$ROUNDS"
printf "%-10s %-16s %5s %16s %16s %7s  %-10s %7s\n" target test procs fio surge ratio verdict "ratio*"
worst_shm_iops=""
while read -r target test procs; do
    metric_col=5; unit="MiB/s"; scale=1048576
    case $test in rand-*) metric_col=6; unit="IOPS"; scale=1 ;; esac
    f=$(awk -v t="$target" -v x="$test" -v p="$procs" -v c=$metric_col '$1==t && $2==x && $3==p && $4=="fio" {print $c}' "$RESULTS" | median)
    s=$(awk -v t="$target" -v x="$test" -v p="$procs" -v c=$metric_col '$1==t && $2==x && $3==p && $4=="surge" {print $c}' "$RESULTS" | median)
    s2=$(awk -v t="$target" -v x="$test" -v p="$procs" -v c=$((metric_col + 2)) '$1==t && $2==x && $3==p && $4=="surge" {print $c}' "$RESULTS" | median)
    ratio2=$(awk -v s="$s2" -v f="$f" 'BEGIN { if (f > 0) printf "%.3f", s / f; else print "n/a" }')
    ratio=$(awk -v s="$s" -v f="$f" 'BEGIN { if (f > 0) printf "%.3f", s / f; else print "n/a" }')
    verdict=$(awk -v r="$ratio" 'BEGIN { if (r == "n/a") print "n/a"; else if (r >= 0.85 && r <= 1.15) print "within 15%"; else print "DIFFERS" }')
    fv=$(awk -v v="$f" -v k=$scale -v u="$unit" 'BEGIN { printf "%.0f %s", v / k, u }')
    sv=$(awk -v v="$s" -v k=$scale -v u="$unit" 'BEGIN { printf "%.0f %s", v / k, u }')
    printf "%-10s %-16s %5s %16s %16s %7s  %-10s %7s\n" "$target" "$test" "$procs" "$fv" "$sv" "$ratio" "$verdict" "$ratio2"
    if [ "$(stat -f -c %T "$target")" = tmpfs ] && [[ $test == rand-* ]]; then
        worst_shm_iops=$(awk -v a="${worst_shm_iops:-9}" -v r="$ratio" 'BEGIN { print (r < a) ? r : a }')
    fi
done < <(awk '{print $1, $2, $3}' "$RESULTS" | awk '!seen[$0]++')
echo "ratio* = surge rated the way fio rates a group (bytes / the slowest process's own time)"
if [ -n "$worst_shm_iops" ]; then
    echo
    awk -v r="$worst_shm_iops" 'BEGIN { printf "4 KiB on tmpfs: lowest surge/fio IOPS ratio %.3f (required >= 0.85): %s\n", r, (r >= 0.85) ? "ok" : "BELOW TARGET" }'
fi
