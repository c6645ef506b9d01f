#!/usr/bin/env bash
# Performance targets (issue 18): a target asked for vs measured at the mount. Calibrates one
# fragment (`surge bench calibrate` inside a job whose instance is one fragment), then runs
# `#SURGE jobdw bandwidth=K x the fragment's bandwidth` jobs for K = 1, 2, 4 with
# `surge run --peaks --measure-targets`, and prints fragments, promised and measured write and
# read bandwidth (measured / promised: the goal is within 20%, or refused up front).
#
# Usage: bench/targets.sh [--servers N]
# Needs root (FUSE); builds the release binary if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
SERVERS=4
while [ $# -gt 0 ]; do
    case "$1" in
        --servers) SERVERS=$2; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
[ -x target/release/surge ] || cargo build --release -p surge-cli
S=$PWD/target/release/surge
export SURGE_FAST_DIR=/dev/shm/surge-bench-targets SURGE_SERVERS=$SERVERS
export SURGE_SERVER_CAPACITY=2GiB SURGE_GRANULARITY=512MiB
unset SURGE_MANAGER SURGE_PEAKS
W=/tmp/surge-bench-targets
rm -rf "$W" && mkdir -p "$W" && cd "$W"
cat > calibrate.sh <<EOF
#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=512MiB
$S bench calibrate \$DW_JOB_STRIPED --out $W/fragment.json --max-procs 4 --bw-aggregate 256MiB \\
    --iops-aggregate 32MiB --md-files 2000 --deadline 2 > /dev/null
EOF
$S run -q calibrate.sh
per=$(python3 -c "import json; p=json.load(open('fragment.json')); print(int(min(p['read_bw'], p['write_bw'])))")
echo "one fragment: $((per / 1048576)) MiB/s (lower of read and write peaks)"
for k in 1 2 4; do
    printf '#!/bin/bash\n#SURGE jobdw bandwidth=%sMiB/s\ntrue\n' $((per * k / 1048576)) > job.sh
    rm -f r.json
    $S run -q --peaks fragment.json --measure-targets --report r.json job.sh 2> err.txt || true
    python3 - "$k" <<'EOF'
import json, sys
k = sys.argv[1]
try:
    r = json.load(open("r.json"))
except Exception:
    r = {}
t = r.get("targets")
if not t or "measured" not in t:
    print(f"  {k}x: refused or failed: {open('err.txt').read().strip()[-300:]}")
    sys.exit()
m, o = t["measured"], t["offer"]
g = 1 << 30
p = m["promised_bytes_per_s"]
print(f"  {k}x: {o['fragments']} fragment(s), promised {p/g:.2f} GiB/s; measured write "
      f"{m['write_bytes_per_s']/g:.2f} GiB/s ({m['write_bytes_per_s']/p:.2f}), read "
      f"{m['read_bytes_per_s']/g:.2f} GiB/s ({m['read_bytes_per_s']/p:.2f}), {m['procs']} procs")
EOF
done
