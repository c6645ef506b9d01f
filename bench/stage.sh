#!/usr/bin/env bash
# Staging benchmark (issue 3, Performance): `surge stage copy` against, in the same run,
#   mount - `cp -r` of the same tree into (and out of) a FUSE mount of the same instance,
#           what a user would do by hand;
#   raw   - `cp -r` into (and out of) the raw fast-tier directory (/dev/shm), the limit.
# Data sets: (a) BIG_COUNT files of BIG_MIB MiB (default 4 x 1 GiB), (b) SMALL_COUNT files of
# SMALL_BYTES bytes (default 20,000 x 4 KiB), in a directory on the local disk ($WORKDIR, default
# under /tmp). Stage-in copies that directory into the instance; stage-out copies the instance's
# copy back to a new directory on the local disk.
# Fairness: the page cache is dropped (sync; echo 3 >/proc/sys/vm/drop_caches) before every
# timed copy, so every stage-in reads its source from the disk and every stage-out through the
# mount reads from the servers, not from pages the kernel kept. With --warm, stage-in sources are
# read into the page cache instead (cat >/dev/null) before each stage-in, which takes the disk
# out of the comparison (the raw copy is then bound by memory, a stricter limit). Every stage-out is timed up to
# durable data (cp -r ... && sync, as `surge stage copy --out` ends with syncfs). Each copy is
# run REPS times; medians are printed with the ratios surge/mount and surge/raw (>1: surge is
# faster).
#
# Usage: bench/stage.sh [--reps N] [--servers N] [--big-count N] [--big-mib N]
#                       [--small-count N] [--small-bytes N] [--workers N] [--warm] [--json FILE]
# Needs root (FUSE mount, dropping caches) and a release build (built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

REPS=3 SERVERS=2 BIG_COUNT=4 BIG_MIB=1024 SMALL_COUNT=20000 SMALL_BYTES=4096 WORKERS=32 JSON="" WARM=0
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) REPS=$2; shift 2 ;;
        --servers) SERVERS=$2; shift 2 ;;
        --big-count) BIG_COUNT=$2; shift 2 ;;
        --big-mib) BIG_MIB=$2; shift 2 ;;
        --small-count) SMALL_COUNT=$2; shift 2 ;;
        --small-bytes) SMALL_BYTES=$2; shift 2 ;;
        --workers) WORKERS=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        --warm) WARM=1; shift ;;
        -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "stage.sh: needs root (FUSE mount, dropping caches)" >&2; exit 1; }

SURGE=${SURGE:-${CARGO_TARGET_DIR:-target}/release/surge}
[ -x "$SURGE" ] || cargo build --release -p surge-cli
WORK=$(mktemp -d "${WORKDIR:-/tmp}/surge-stage-bench.XXXXXX")
SHM=/dev/shm/surge-stage-bench-$$
MNT=$WORK/mnt
mkdir -p "$SHM/raw" "$MNT"
PIDS=()
cleanup() {
    set +e
    mountpoint -q "$MNT" && { fusermount3 -u "$MNT" 2>/dev/null || umount -l "$MNT"; }
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    sleep 0.5
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$SHM" "$WORK"
}
trap cleanup EXIT INT TERM

# --- sources on the local disk ---
echo "making the sources in $WORK ($(df --output=fstype "$WORK" | tail -1))" >&2
mkdir -p "$WORK/src/big" "$WORK/src/small"
for i in $(seq 1 "$BIG_COUNT"); do
    head -c "$((BIG_MIB << 20))" /dev/urandom >"$WORK/src/big/f$i"
done
python3 - "$WORK/src/small" "$SMALL_COUNT" "$SMALL_BYTES" <<'EOF'
import os, sys
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    with open(os.path.join(d, "f%05d" % i), "wb") as f:
        f.write(os.urandom(size))
EOF
sync

# --- servers, instance, mount ---
ADDRS=()
for i in $(seq 1 "$SERVERS"); do
    "$SURGE" server --device "$SHM/bb$i" --capacity 64GiB --listen 127.0.0.1:0 --unix "$SHM/bb$i.sock" \
        --ready-file "$WORK/bb$i.ready" 2>"$WORK/bb$i.log" &
    PIDS+=($!)
done
for i in $(seq 1 "$SERVERS"); do
    for _ in $(seq 200); do [ -s "$WORK/bb$i.ready" ] && break; sleep 0.05; done
    ADDRS+=("$(python3 -c 'import json,sys; print([a for a in json.load(open(sys.argv[1]))["addrs"] if not a.startswith("unix:")][0])' "$WORK/bb$i.ready")")
done
CAP=$(( (BIG_COUNT * BIG_MIB * 3 + 4096) ))MiB
ID=$("$SURGE" instance create --servers "$(IFS=,; echo "${ADDRS[*]}")" --capacity "$CAP" --json \
     | python3 -c 'import json,sys; print(json.load(sys.stdin)["instance"])')
"$SURGE" mount --server "${ADDRS[0]}" --instance "$ID" --ready-file "$WORK/mnt.ready" "$MNT" 2>"$WORK/mount.log" &
PIDS+=($!)
for _ in $(seq 200); do [ -s "$WORK/mnt.ready" ] && mountpoint -q "$MNT" && break; sleep 0.05; done
mountpoint -q "$MNT" || { echo "surge mount failed:"; cat "$WORK/mount.log"; exit 1; }

drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
# Before a stage-in: a cold cache, or (--warm) the source read into the page cache.
prep_in() { drop; [ "$WARM" = 0 ] || find "$1" -type f -exec cat {} + >/dev/null; }
now() { date +%s.%N; }
# timed CMD... -> seconds
timed() { local t0; t0=$(now); "$@" >/dev/null; echo "$(now) - $t0" | bc -l; }
stage() { "$SURGE" stage copy --server "${ADDRS[0]}" --instance "$ID" --workers "$WORKERS" "$@" 2>>"$WORK/stage.log"; }
cp_sync() { cp -r "$1" "$2" && sync; }
# Compares two trees by content; a benchmark of wrong copies is worthless.
same() { diff -r -q "$1" "$2" >/dev/null || { echo "MISMATCH: $1 vs $2" >&2; exit 1; }; }

declare -A R
add() { R[$1]="${R[$1]:-} $2"; }
for rep in $(seq 1 "$REPS"); do
    for set in big small; do
        src=$WORK/src/$set
        # raw fast tier
        prep_in "$src"; add "raw,in,$set" "$(timed cp -r "$src" "$SHM/raw/$set")"
        drop; add "raw,out,$set" "$(timed cp_sync "$SHM/raw/$set" "$WORK/out-raw")"
        same "$src" "$WORK/out-raw"
        rm -rf "$SHM/raw/$set" "$WORK/out-raw"
        # cp -r through the mount
        prep_in "$src"; add "mount,in,$set" "$(timed cp -r "$src" "$MNT/cp-$set")"
        drop; add "mount,out,$set" "$(timed cp_sync "$MNT/cp-$set" "$WORK/out-mnt")"
        same "$src" "$WORK/out-mnt"
        rm -rf "$MNT/cp-$set" "$WORK/out-mnt"
        # surge stage copy (native client, not through the mount)
        prep_in "$src"; add "surge,in,$set" "$(timed stage --in --directory "$src" "/st-$set")"
        drop; add "surge,out,$set" "$(timed stage --out --directory "/st-$set" "$WORK/out-st")"
        same "$src" "$WORK/out-st"
        rm -rf "$MNT/st-$set" "$WORK/out-st"
        echo "rep $rep $set: in raw ${R[raw,in,$set]##* } mount ${R[mount,in,$set]##* } surge ${R[surge,in,$set]##* }" \
             "| out raw ${R[raw,out,$set]##* } mount ${R[mount,out,$set]##* } surge ${R[surge,out,$set]##* } (s)" >&2
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
BIG_BYTES=$((BIG_COUNT * BIG_MIB << 20)); SMALL_TOTAL=$((SMALL_COUNT * SMALL_BYTES))
printf '\n%s servers, %s reps (medians), stage-in sources %s; (a) %s x %s MiB, (b) %s x %s B; surge stage --workers %s\n' \
    "$SERVERS" "$REPS" "$([ "$WARM" = 1 ] && echo "in the page cache" || echo "cold (caches dropped)")" \
    "$BIG_COUNT" "$BIG_MIB" "$SMALL_COUNT" "$SMALL_BYTES" "$WORKERS"
printf '%-10s %9s %9s %9s %11s %11s %11s %12s %12s\n' case raw_s mount_s surge_s raw_rate mount_rate surge_rate surge/mount surge/raw
JS="{\"servers\": $SERVERS, \"reps\": $REPS, \"warm\": $WARM, \"workers\": $WORKERS, \"results\": {"
first=1
for set in big small; do
    for dir in in out; do
        raw=$(echo "${R[raw,$dir,$set]}" | median); mnt=$(echo "${R[mount,$dir,$set]}" | median)
        sg=$(echo "${R[surge,$dir,$set]}" | median)
        if [ $set = big ]; then
            unit=MiB/s; q=$(echo "$BIG_BYTES / 1048576" | bc -l)
        else
            unit=files/s; q=$SMALL_COUNT
        fi
        printf '%-10s %9.2f %9.2f %9.2f %11.0f %11.0f %11.0f %12.2f %12.2f  %s\n' "$dir-$set" "$raw" "$mnt" "$sg" \
            "$(echo "$q/$raw" | bc -l)" "$(echo "$q/$mnt" | bc -l)" "$(echo "$q/$sg" | bc -l)" \
            "$(echo "$mnt/$sg" | bc -l)" "$(echo "$raw/$sg" | bc -l)" "$unit"
        [ $first -eq 1 ] || JS+=", "; first=0
        JS+="\"$dir-$set\": {\"unit\": \"$unit\", \"raw_s\": $raw, \"mount_s\": $mnt, \"surge_s\": $sg, \"all\": {\"raw\": [$(echo ${R[raw,$dir,$set]} | tr ' ' ',')], \"mount\": [$(echo ${R[mount,$dir,$set]} | tr ' ' ',')], \"surge\": [$(echo ${R[surge,$dir,$set]} | tr ' ' ',')]}}"
    done
done
JS+="}}"
[ -z "$JSON" ] || echo "$JS" >"$JSON"
