#!/bin/bash
# A checkpoint burst into a type=cache instance over a throttled slow PFS (contrib/slowpfs),
# against, in the same run:
#   scratch - the same burst into a type=scratch instance (what the job would perceive without
#             write-behind: the bar is cache >= 0.9 of scratch);
#   pfs     - the same burst written straight to the PFS directory, with fsync (the PFS's own
#             rate: the bar is drain >= 0.9 of it).
# The burst: fio, NJOBS processes x SIZE each, 8 MiB sequential writes, file per process.
# "perceived" is fio's bandwidth inside the job; "drain" is the rate at which the drain wrote
# the PFS (bytes copied / time spent copying, from surge run's drain line); "end" is the time
# from the job's start until everything is on the PFS (the drain starts on each file's close).
#   full    - the same burst into a cache instance of a quarter of its size (Liu's fall-back:
#             files switch to writing through when the tier is full); "full end" is the time
#             from the job's start until everything is on the PFS, its rate the burst over that
#             time; the bar: no less than the PFS's own rate, measured the same way ("pfs
#             wall": the burst over the wall time of the fio command on the PFS directory,
#             from its start to the end of its fsync).
# Sides alternate their order from run to run. Then `surge sim` (bench/sim/one_host.toml,
# bench/sim/burst.kernel) is given the measured rates (the scratch burst as the burst buffer's
# write bandwidth, the direct PFS write as the PFS device's) and predicts the perceived
# bandwidth and the end of the drain; printed against the measured medians (bar: within 20%).
#
#   bench/cache_burst.sh [--runs N] [--size 1G] [--jobs 2] [--write-mbps 200] [--read-mbps 400]
#                        [--dirty-high MARK] [--passthrough on|off] [--pfs slow|net] [--rate 1gbit]
#
# --dirty-high: the cache instances' dirty_high= (80%, 400MiB, off; default: the jobdw default).
# --passthrough: the cache instances' passthrough= (on: kernel passthrough for files of the
#                mount's host while the tier has room at their open; default: off).
# --pfs net:     the PFS is contrib/netpfs (GlusterFS over a veth link of --rate with a
#                network's latency) instead of contrib/slowpfs (a throttled disk, the default;
#                --write-mbps/--read-mbps apply to it).
#
# Needs root (slowpfs, netpfs, FUSE). SURGE=<surge binary> (default target/release/surge,
# built if missing). The PFS is brought up (bench/lib/pfs.sh) and taken down at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=3 SIZE=1G NJOBS=2 WMBPS=200 RMBPS=400 DIRTY_HIGH= PASSTHROUGH= PFS_KIND=slow RATE=1gbit
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --size) SIZE=$2; shift 2 ;;
        --jobs) NJOBS=$2; shift 2 ;;
        --write-mbps) WMBPS=$2; shift 2 ;;
        --read-mbps) RMBPS=$2; shift 2 ;;
        --dirty-high) DIRTY_HIGH=$2; shift 2 ;;
        --passthrough) PASSTHROUGH=$2; shift 2 ;;
        --pfs) PFS_KIND=$2; shift 2 ;;
        --rate) RATE=$2; shift 2 ;;
        -h|--help) sed -n 2,29p "$0"; exit 0 ;;
        *) echo "cache_burst.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
SURGE=${SURGE:-target/release/surge}
[ -x "$SURGE" ] || cargo build --release -p surge-cli
command -v fio >/dev/null || apt-get install -y -qq fio >/dev/null
. bench/lib/pfs.sh
pfs_up "$PFS_KIND" burst
trap pfs_down EXIT
WORK=$(mktemp -d /tmp/surge-cache-burst.XXXXXX)
FIO="fio --name=ckpt --rw=write --bs=8M --size=$SIZE --numjobs=$NJOBS --group_reporting \
--end_fsync=0 --output-format=json"

# MiB/s of a fio JSON output's write bandwidth.
fio_mibs() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.0f" % (d["jobs"][0]["write"]["bw_bytes"] / 1048576))' "$1"; }
# Seconds of a `surge run` phase line ("surge run: drain ... 12.3 s").
phase_s() { awk -v p="$2" '$0 ~ "surge run: " p " " { v = $(NF - 1) } END { print v + 0 }' "$1"; }

pfs_side() { # -> "fio_MiB/s wall_s"
    rm -rf "$PFS/direct"; mkdir -p "$PFS/direct"
    local t0 t1
    t0=$(date +%s.%N)
    $FIO --directory="$PFS/direct" --end_fsync=1 > "$WORK/pfs.json"
    t1=$(date +%s.%N)
    rm -rf "$PFS/direct"
    echo "$(fio_mibs "$WORK/pfs.json") $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')"
}

# The burst's total in MiB (SIZE is fio's: 1G, 512M, ...).
burst_mib() {
    local n=${SIZE%[GgMm]} unit=${SIZE: -1}
    case $unit in G|g) echo $((n * 1024 * NJOBS)) ;; M|m) echo $((n * NJOBS)) ;; *) echo $((SIZE / 1048576 * NJOBS)) ;; esac
}

job_side() { # scratch|cache|full -> "perceived_MiB/s job_s drain_s drain_MiB/s"
    local kind=$1 dir var
    if [ "$kind" = cache ] || [ "$kind" = full ]; then
        rm -rf "$PFS/run"; mkdir -p "$PFS/run"
        local cap="$((NJOBS * 2 + 1))GiB"
        [ "$kind" = full ] && cap="$(( $(burst_mib) / 4 ))MiB"
        dir="type=cache access_mode=striped capacity=$cap pfs=$PFS/run${DIRTY_HIGH:+ dirty_high=$DIRTY_HIGH}${PASSTHROUGH:+ passthrough=$PASSTHROUGH}"
        var=DW_JOB_STRIPED_CACHE
    else
        dir="type=scratch access_mode=striped capacity=$((NJOBS * 2 + 1))GiB"
        var=DW_JOB_STRIPED
    fi
    cat > "$WORK/job.sh" <<EOF
#!/bin/bash
#DW jobdw $dir
$FIO --directory=\$$var > $WORK/$kind.json
EOF
    "$SURGE" run "$WORK/job.sh" 2> "$WORK/$kind.log" >/dev/null
    local rate
    rate=$(sed -n 's/.*surge run: drain .*(\([0-9]*\) MiB\/s).*/\1/p' "$WORK/$kind.log")
    echo "$(fio_mibs "$WORK/$kind.json") $(phase_s "$WORK/$kind.log" job) $(phase_s "$WORK/$kind.log" drain) ${rate:-0}"
    rm -rf "$PFS/run"
}

echo "burst: $NJOBS x $SIZE (8 MiB writes); PFS: $PFS_TEXT"
printf '%-5s %10s %9s %10s %10s %10s %8s %12s %12s %10s %10s\n' run "pfs MiB/s" "pfs wall" "scratch" "cache" "drain" "end s" "cache/scr" "drain/pfs" "full end" "full/pfs"
R_PERC=() R_DRAIN=() R_FULL=() M_PFS=() M_SCR=() M_CACHE=() M_END=()
for run in $(seq 1 "$RUNS"); do
    if [ $((run % 2)) -eq 1 ]; then
        p=$(pfs_side); s=$(job_side scratch); c=$(job_side cache); f=$(job_side full)
    else
        f=$(job_side full); c=$(job_side cache); s=$(job_side scratch); p=$(pfs_side)
    fi
    read -r p p_wall <<< "$p"
    read -r s_bw _ _ <<< "$s"
    read -r c_bw c_job c_drain drain_bw <<< "$c"
    read -r _ f_job f_drain _ <<< "$f"
    f_end=$(awk -v a="$f_job" -v b="$f_drain" 'BEGIN { printf "%.2f", a + b }')
    p_wall_bw=$(awk -v m="$(burst_mib)" -v w="$p_wall" 'BEGIN { printf "%.0f", m / w }')
    r3=$(awk -v w="$p_wall" -v e="$f_end" 'BEGIN { printf "%.2f", w / e }')
    R_FULL+=("$r3")
    end_s=$(awk -v a="$c_job" -v b="$c_drain" 'BEGIN { printf "%.2f", a + b }')
    r1=$(awk -v a="$c_bw" -v b="$s_bw" 'BEGIN { printf "%.2f", a / b }')
    r2=$(awk -v a="$drain_bw" -v b="$p" 'BEGIN { printf "%.2f", a / b }')
    R_PERC+=("$r1"); R_DRAIN+=("$r2")
    M_PFS+=("$p"); M_SCR+=("$s_bw"); M_CACHE+=("$c_bw")
    M_END+=("$end_s")
    printf '%-5s %10s %9s %10s %10s %10s %8s %12s %12s %10s %10s\n' "$run" "$p" "$p_wall_bw" "$s_bw" "$c_bw" "$drain_bw" "$end_s" "$r1" "$r2" "$f_end" "$r3"
done
med() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo "median: cache perceived / scratch = $(med "${R_PERC[@]}") (bar >= 0.9); drain / PFS = $(med "${R_DRAIN[@]}") (bar >= 0.9)"
echo "median: burst into a cache of a quarter of its size, end-to-end rate / PFS's end-to-end rate (pfs wall) = $(med "${R_FULL[@]}") (bar >= 1.0: the fall-back finishes at no less than the PFS's rate)"

# The model, given this run's rates.
pfs_m=$(med "${M_PFS[@]}"); scr_m=$(med "${M_SCR[@]}"); cache_m=$(med "${M_CACHE[@]}"); end_m=$(med "${M_END[@]}")
"$SURGE" sim run bench/sim/one_host.toml bench/sim/burst.kernel --json \
    --param procs="$NJOBS" --param size="${SIZE}iB" \
    --set compute.processes_per_node="$NJOBS" \
    --set burst_buffer.write_bandwidth="${scr_m}MiB/s" \
    --set storage.lun_bandwidth="${pfs_m}MiB/s" > "$WORK/sim.json"
read -r sim_perc sim_end <<< "$(python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
print("%.0f %.2f" % (d["apps"][0]["perceived_write_gib_s"] * 1024, d["totals"]["last_drain_s"]))' "$WORK/sim.json")"
echo "surge sim (burst buffer ${scr_m} MiB/s, PFS ${pfs_m} MiB/s): perceived $sim_perc MiB/s vs measured $cache_m ($(awk -v a="$cache_m" -v b="$sim_perc" 'BEGIN { printf "%.2f", a / b }')); drain ends at $sim_end s vs measured $end_m s ($(awk -v a="$end_m" -v b="$sim_end" 'BEGIN { printf "%.2f", a / b }')) (bar: within 0.8-1.2)"
rm -rf "$WORK"
