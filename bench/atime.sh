#!/usr/bin/env bash
# What keeping access times costs (docs/SEMANTICS.md, "Access times"): the same instance
# mounted twice on this host, once as every mount is by default (`relatime`: the first open
# for reading after a change asks the metadata server to move the file's atime) and once
# `-o noatime` (no such request). Workload, per side: write FILES small files, then open and
# read each once (every open is a first read after a write: relatime's worst case), timed; a
# second pass of opens (relatime has nothing to move: its usual case); then 1,000 listings of a
# directory of 10 files (each listing asks the metadata server to move the directory's atime,
# beside the page's own request). Sides alternate, RUNS runs after one warm-up of each; prints
# each run and the medians of relatime/noatime.
#
#   bench/atime.sh [--runs 5] [--files 2000] [--json FILE]
# Needs root, /dev/fuse, python3, jq. SURGE=path/to/surge (default target/release/surge,
# else target/debug/surge).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=5 FILES=2000 JSON=""
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --files) FILES=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        -h|--help) sed -n 2,13p "$0"; exit 0 ;;
        *) echo "atime.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "atime.sh: mounts need root here" >&2; exit 2; }
S=${SURGE:-}
if [ -z "$S" ]; then
    for t in target/release/surge target/debug/surge; do [ -x "$t" ] && { S=$t; break; }; done
fi
[ -x "${S:-}" ] || { echo "atime.sh: no surge binary (cargo build -p surge-cli, or set SURGE)" >&2; exit 2; }
S=$(readlink -f "$S")
W=$(mktemp -d /tmp/surge-atime.XXXXXX)
T=$(mktemp -d /dev/shm/surge-atime.XXXXXX)
pids=()
cleanup() {
    set +e
    for m in "$W/relatime" "$W/noatime"; do mountpoint -q "$m" && umount "$m"; done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$W" "$T"
}
trap cleanup EXIT
export SURGE_KEY_FILE=$W/key
"$S" key create --key-file "$SURGE_KEY_FILE" >/dev/null
for i in 0 1; do
    "$S" server --device "$T/bb$i" --capacity 4GiB --listen 127.0.0.1:0 --unix "$W/bb$i.sock" \
        --ready-file "$W/bb$i.ready" 2>"$W/server$i.log" &
    pids+=($!)
done
wait_for() { for _ in $(seq 200); do [ -s "$1" ] && return 0; sleep 0.05; done; echo "atime.sh: $1 never came" >&2; exit 1; }
addrs=()
for i in 0 1; do
    wait_for "$W/bb$i.ready"
    addrs+=("$(jq -r '.addrs[] | select(startswith("unix:") | not)' "$W/bb$i.ready")")
done
id=$("$S" instance create --servers "$(IFS=,; echo "${addrs[*]}")" --capacity 2GiB --json | jq -r .instance)
for side in relatime noatime; do
    mkdir -p "$W/$side"
    opt=()
    [ "$side" = noatime ] && opt=(-o noatime)
    "$S" mount --server "unix:$W/bb0.sock" --instance "$id" "${opt[@]}" \
        --ready-file "$W/$side.ready" "$W/$side" 2>"$W/mount-$side.log" &
    pids+=($!)
    wait_for "$W/$side.ready"
done

# One side's pass: prints "first-read-opens-per-s second-read-opens-per-s listings-per-s".
pass() {
    python3 - "$1" "$FILES" <<'EOF'
import os, sys, time
root, n = sys.argv[1], int(sys.argv[2])
d = os.path.join(root, "t%d" % os.getpid())
os.mkdir(d)
names = [os.path.join(d, "f%d" % i) for i in range(n)]
for p in names:
    with open(p, "wb") as f:
        f.write(b"a small file\n")
rates = []
for _ in range(2):
    t0 = time.perf_counter()
    for p in names:
        with open(p, "rb") as f:
            f.read()
    rates.append(n / (time.perf_counter() - t0))
l = os.path.join(d, "listed")
os.mkdir(l)
for i in range(10):
    open(os.path.join(l, "e%d" % i), "wb").close()
t0 = time.perf_counter()
for _ in range(1000):
    os.listdir(l)
rates.append(1000 / (time.perf_counter() - t0))
for i in range(10):
    os.unlink(os.path.join(l, "e%d" % i))
os.rmdir(l)
for p in names:
    os.unlink(p)
os.rmdir(d)
print("%.0f %.0f %.0f" % tuple(rates))
EOF
}
pass "$W/relatime" >/dev/null
pass "$W/noatime" >/dev/null
results=()
for r in $(seq "$RUNS"); do
    if [ $((r % 2)) -eq 1 ]; then order=(relatime noatime); else order=(noatime relatime); fi
    declare -A got=()
    for side in "${order[@]}"; do got[$side]=$(pass "$W/$side"); done
    read -r rf rs rl <<<"${got[relatime]}"
    read -r nf ns nl <<<"${got[noatime]}"
    first=$(python3 -c "print(f'{$rf/$nf:.3f}')")
    second=$(python3 -c "print(f'{$rs/$ns:.3f}')")
    lists=$(python3 -c "print(f'{$rl/$nl:.3f}')")
    echo "run $r (${order[0]} first): opens/s first read after a write: relatime $rf, noatime $nf ($first); second read: relatime $rs, noatime $ns ($second); listings/s: relatime $rl, noatime $nl ($lists)"
    results+=("$first $second $lists")
    unset got
done
med() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
mf=$(printf '%s\n' "${results[@]}" | awk '{print $1}' | med)
ms=$(printf '%s\n' "${results[@]}" | awk '{print $2}' | med)
ml=$(printf '%s\n' "${results[@]}" | awk '{print $3}' | med)
echo "relatime/noatime, medians of $RUNS runs: opens per second, first read after a write $mf, second read $ms; listings per second $ml"
if [ -n "$JSON" ]; then
    jq -n --argjson f "$mf" --argjson s "$ms" --argjson l "$ml" --argjson runs "$RUNS" \
        --argjson files "$FILES" \
        '{files: $files, runs: $runs, first_read_ratio: $f, second_read_ratio: $s, listing_ratio: $l}' >"$JSON"
fi
