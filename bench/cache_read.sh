#!/bin/bash
# Reads through a type=cache instance over a throttled slow PFS (contrib/slowpfs), against, in
# the same run:
#   pfs      - fio reading the input files straight from the PFS directory (their pages dropped
#              first): the PFS's own read rate;
#   first    - a cache job over that directory: the fill (the lazy fill makes the namespace
#              only; a file's first read goes to the PFS and copies it into the tier behind
#              it) plus fio's first read inside the job; the rate is the bytes over fill + read
#              time (the bar: >= 0.9 of pfs);
#   reread   - fio reading the same files again in that job, once the copies into the tier are
#              complete (the job waits for the instance's used space; the bar: >= 0.9 of
#              scratch);
#   scratch  - fio reading the same files staged into a type=scratch instance.
# The input: NJOBS files of SIZE (fio's own files, written once on the PFS). 1 MiB reads.
# Sides alternate their order from run to run.
#
#   bench/cache_read.sh [--runs N] [--size 1G] [--jobs 2] [--write-mbps 200] [--read-mbps 400]
#                       [--passthrough on|off] [--pfs slow|net] [--rate 1gbit]
#
# --passthrough: the cache instance's passthrough= (on: kernel passthrough for files of the
#                mount's host once their copy into the tier is complete; default: off).
# --pfs net:     the PFS is contrib/netpfs (GlusterFS over a veth link of --rate with a
#                network's latency; its client is remounted before each PFS read) instead of
#                contrib/slowpfs (a throttled disk, the default; --write-mbps/--read-mbps
#                apply to it).
#
# Needs root (slowpfs, netpfs, FUSE). SURGE=<surge binary> (default target/release/surge,
# built if missing). The PFS is brought up (bench/lib/pfs.sh) and taken down at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=3 SIZE=1G NJOBS=2 WMBPS=200 RMBPS=400 PASSTHROUGH= PFS_KIND=slow RATE=1gbit
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --size) SIZE=$2; shift 2 ;;
        --jobs) NJOBS=$2; shift 2 ;;
        --write-mbps) WMBPS=$2; shift 2 ;;
        --read-mbps) RMBPS=$2; shift 2 ;;
        --passthrough) PASSTHROUGH=$2; shift 2 ;;
        --pfs) PFS_KIND=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        -h|--help) sed -n 2,28p "$0"; exit 0 ;;
        *) echo "cache_read.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
SURGE=${SURGE:-target/release/surge}
[ -x "$SURGE" ] || cargo build --release -p surge-cli
command -v fio >/dev/null || apt-get install -y -qq fio >/dev/null
. bench/lib/pfs.sh
pfs_up "$PFS_KIND" read
WORK=$(mktemp -d /tmp/surge-cache-read.XXXXXX)
trap 'pfs_down; rm -rf "$WORK"' EXIT
FIO="fio --name=in --bs=1M --size=$SIZE --numjobs=$NJOBS --group_reporting --output-format=json"
IN=$PFS/in
mkdir -p "$IN"
$FIO --rw=write --directory="$IN" --end_fsync=1 > /dev/null

# Drops what the PFS client caches of the input files, so reads go to the PFS.
drop() { pfs_cold "$IN"/*; }
fio_read_mibs() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.0f" % (d["jobs"][0]["read"]["bw_bytes"] / 1048576))' "$1"; }
fio_read_s() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.3f" % (d["jobs"][0]["read"]["runtime"] / 1000))' "$1"; }
# Seconds of a `surge run` phase line ("surge run: fill ... 12.3 s").
phase_s() { awk -v p="$2" '$0 ~ "surge run: " p " " { v = $(NF - 1) } END { print v + 0 }' "$1"; }
MIB=$(python3 -c "
s='$SIZE'; u={'K':1/1024,'M':1,'G':1024}.get(s[-1].upper())
print(int(float(s[:-1]) * u * $NJOBS) if u else int(int(s) / 1048576 * $NJOBS))")

pfs_side() {
    drop
    $FIO --rw=read --directory="$IN" > "$WORK/pfs.json"
    fio_read_mibs "$WORK/pfs.json"
}

cache_side() { # -> "first_MiB/s reread_MiB/s"
    drop
    cat > "$WORK/cache.sh" <<EOF
#!/bin/bash
#DW jobdw type=cache access_mode=striped capacity=$((NJOBS * 2 + 1))GiB pfs=$IN${PASSTHROUGH:+ passthrough=$PASSTHROUGH}
used() { df --output=used -B1M \$DW_JOB_STRIPED_CACHE | tail -1; }
before=\$(used)
$FIO --rw=read --directory=\$DW_JOB_STRIPED_CACHE > $WORK/first.json
for i in \$(seq 600); do [ \$(( \$(used) - before )) -ge $MIB ] && break; sleep 0.1; done
echo "copied into the tier: \$(( \$(used) - before )) MiB" >&2
$FIO --rw=read --directory=\$DW_JOB_STRIPED_CACHE > $WORK/reread.json
EOF
    "$SURGE" run "$WORK/cache.sh" 2> "$WORK/cache.log" >/dev/null
    local fill read
    fill=$(phase_s "$WORK/cache.log" fill)
    read=$(fio_read_s "$WORK/first.json")
    echo "$(awk -v m="$MIB" -v a="$fill" -v b="$read" 'BEGIN { printf "%.0f", m / (a + b) }') $(fio_read_mibs "$WORK/reread.json") $fill"
}

scratch_side() {
    drop
    cat > "$WORK/scratch.sh" <<EOF
#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=$((NJOBS * 2 + 1))GiB
#DW stage_in type=directory source=$IN destination=\$DW_JOB_STRIPED
$FIO --rw=read --directory=\$DW_JOB_STRIPED > $WORK/scratch.json
EOF
    "$SURGE" run "$WORK/scratch.sh" 2> "$WORK/scratch.log" >/dev/null
    fio_read_mibs "$WORK/scratch.json"
}

echo "input: $NJOBS x $SIZE on $PFS ($PFS_TEXT); fio, 1 MiB reads, $NJOBS jobs"
printf '%-5s %10s %12s %8s %12s %10s %12s %12s\n' run "pfs MiB/s" "first MiB/s" "fill s" "reread MiB/s" "scratch" "first/pfs" "reread/scr"
R_FIRST=() R_RE=()
for run in $(seq 1 "$RUNS"); do
    if [ $((run % 2)) -eq 1 ]; then
        p=$(pfs_side); c=$(cache_side); s=$(scratch_side)
    else
        s=$(scratch_side); c=$(cache_side); p=$(pfs_side)
    fi
    read -r first reread fill <<< "$c"
    r1=$(awk -v a="$first" -v b="$p" 'BEGIN { printf "%.2f", a / b }')
    r2=$(awk -v a="$reread" -v b="$s" 'BEGIN { printf "%.2f", a / b }')
    R_FIRST+=("$r1"); R_RE+=("$r2")
    printf '%-5s %10s %12s %8s %12s %10s %12s %12s\n' "$run" "$p" "$first" "$fill" "$reread" "$s" "$r1" "$r2"
done
med() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "median: first read (fill + read) / PFS = $(med "${R_FIRST[@]}") (bar >= 0.9); re-read / scratch = $(med "${R_RE[@]}") (bar >= 0.9)"
