#!/bin/bash
# Haider et al.'s normalised metric (seed 004, §III) for Surge's placements: the same IOR grid
# (`surge bench compare`: process counts x transfer sizes, write then read, file per process,
# fsync before close, page cache dropped before reads) on, in the same run and at each grid
# point in rotating order:
#   pfs     - a directory of the slow PFS (contrib/slowpfs: XFS on a loop device throttled to
#             --write-mbps/--read-mbps): Haider's "disk" of the same system, the baseline;
#   local   - a default `surge run` job instance, files of one stripe on a fragment of the
#             writer's host (`surge layout set DIR --stripe-count 1`; kernel passthrough as
#             root): Haider's "local flash" (Gordon, Comet; HPE Rabbit's near-node flash);
#   pooled  - the same instance, every file striped over every fragment (`--stripe-count
#             all`, DataWarp's layout): Haider's "pooled" flash (Wrangler, DataWarp).
# Prints MiB/s of each side and local/pfs, pooled/pfs per point (above 1: that placement beats
# the PFS there); with --runs N, the table of each run (ratios of a run are from one run).
#
#   bench/haider.sh [--runs 1] [--procs 1,2,4] [--transfers 4KiB,64KiB,1MiB,8MiB]
#                   [--aggregate 256MiB] [--write-mbps 200] [--read-mbps 400] [--json FILE]
#
# Needs root (slowpfs, FUSE). SURGE=<surge binary> (default target/release/surge, built if
# missing). The slow PFS is brought up at /run/surge-slowpfs/pfs and taken down at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=1 PROCS=1,2,4 TRANSFERS=4KiB,64KiB,1MiB,8MiB AGG=256MiB WMBPS=200 RMBPS=400 JSON=""
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --procs) PROCS=$2; shift 2 ;;
        --transfers) TRANSFERS=$2; shift 2 ;;
        --aggregate) AGG=$2; shift 2 ;;
        --write-mbps) WMBPS=$2; shift 2 ;;
        --read-mbps) RMBPS=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        -h|--help) sed -n 2,20p "$0"; exit 0 ;;
        *) echo "haider.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "haider.sh: run as root (slowpfs, FUSE mounts)" >&2; exit 2; }
SURGE=${SURGE:-target/release/surge}
[ -x "$SURGE" ] || cargo build --release -p surge-cli
SURGE=$(realpath "$SURGE")
PFS=/run/surge-slowpfs/pfs
contrib/slowpfs/slowpfs.sh up --dir $PFS --size 4G --write-mbps "$WMBPS" --read-mbps "$RMBPS" >/dev/null
WORK=$(mktemp -d /tmp/surge-haider.XXXXXX)
SHM=$(mktemp -d /dev/shm/surge-haider.XXXXXX)
trap 'contrib/slowpfs/slowpfs.sh down --dir $PFS >/dev/null 2>&1 || true; rm -rf "$WORK" "$SHM"' EXIT
cat > "$WORK/job.sh" <<JOB
#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=4GiB
set -e
mkdir -p "\$DW_JOB_STRIPED/local" "\$DW_JOB_STRIPED/pooled" "$PFS/haider"
"$SURGE" layout set "\$DW_JOB_STRIPED/local" --stripe-count 1
"$SURGE" layout set "\$DW_JOB_STRIPED/pooled" --stripe-count all
"$SURGE" bench compare --baseline pfs="$PFS/haider" local="\$DW_JOB_STRIPED/local" \
    pooled="\$DW_JOB_STRIPED/pooled" --procs "$PROCS" --transfers "$TRANSFERS" \
    --aggregate "$AGG" --json > "\$JOB_OUT"
rm -rf "$PFS/haider"
JOB
chmod +x "$WORK/job.sh"
for run in $(seq "$RUNS"); do
    out=$WORK/run-$run.json
    if ! (cd "$WORK" && env SURGE_FAST_DIR="$SHM/fast" SURGE_STATE_DIR="$WORK/state" JOB_OUT="$out" \
            "$SURGE" run -q "$WORK/job.sh" > "$WORK/job-$run.log" 2>&1); then
        echo "the job failed; its output:" >&2; cat "$WORK/job-$run.log" >&2; exit 1
    fi
    echo "run $run of $RUNS (slow PFS: $WMBPS MiB/s write, $RMBPS MiB/s read):"
    python3 - "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
names = [r["baseline"]["name"]] + [t["name"] for t in r["targets"]]
def size(b):
    for u, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return f"{b // n}{u}"
    return f"{b}B"
print(f"{'phase':<6} {'procs':>5} {'xfer':>6} " + " ".join(f"{n + ' MiB/s':>13}" for n in names)
      + " " + " ".join(f"{n + '/pfs':>11}" for n in names[1:]))
for p in r["points"]:
    print(f"{p['phase']:<6} {p['procs']:>5} {size(p['transfer']):>6} "
          + " ".join(f"{b / 1048576:>13.0f}" for b in p["bytes_per_s"]) + " "
          + " ".join(f"{x:>11.2f}" for x in p["normalised"]))
PY
done
if [ -n "$JSON" ]; then
    python3 -c 'import json,sys; json.dump([json.load(open(f)) for f in sys.argv[2:]], open(sys.argv[1], "w"), indent=1)' \
        "$JSON" "$WORK"/run-*.json
fi
