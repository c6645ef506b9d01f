#!/usr/bin/env bash
# Real tools in what a plain `surge run` job gets (issue 34's "real tools" bar: each <= 3x
# tmpfs's time), against, in the same run:
#   raw  - the fast-tier directory itself (/dev/shm, tmpfs): the anchor;
#   job  - the same commands inside a default job instance (`#DW jobdw type=scratch
#          access_mode=striped capacity=4GiB`: the embedded default's 4 servers), run by the
#          user who runs this script (root: kernel passthrough for file data);
#   pll  - libfuse's passthrough_ll over a /dev/shm directory: what any FUSE file system pays
#          for the same requests (no server, no network), the floor of a FUSE mount's ratio.
# Workloads, timed one after another in one directory:
#   untar   tar -xf of a tarball of /usr/include (TAR_SRC; about 8,000 files here), made once
#           outside the timed part on /dev/shm
#   clone   git clone --no-hardlinks of this repository (REPO; its objects copied, then its
#           files checked out)
#   rmrf    rm -rf of both trees
# Sides alternate their order from run to run (the first writes into fresh memory are slow on
# this VM and bias whichever side goes first). Prints each run, the medians (seconds) and
# job/raw and pll/raw time ratios (the bar: job/raw <= 3).
#
#   bench/tools.sh [--runs 3] [--src DIR] [--repo DIR] [--json FILE]
# Needs root (FUSE mounts), tar and git. SURGE=path/to/surge (default target/release/surge,
# built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=3 TAR_SRC=/usr/include REPO=$PWD JSON=""
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --src) TAR_SRC=$2; shift 2 ;;
        --repo) REPO=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        -h|--help) sed -n 2,22p "$0"; exit 0 ;;
        *) echo "tools.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "tools.sh: run as root (FUSE mounts)" >&2; exit 2; }
for tool in tar git python3 gcc pkg-config; do
    command -v $tool >/dev/null || { echo "tools.sh: $tool is missing (scripts/setup.sh)" >&2; exit 2; }
done
[ -d "$TAR_SRC" ] || { echo "tools.sh: --src $TAR_SRC is not a directory" >&2; exit 2; }
git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1 \
    || { echo "tools.sh: --repo $REPO is not a git repository" >&2; exit 2; }
SURGE=${SURGE:-target/release/surge}
[ -x "$SURGE" ] || cargo build --release -p surge-cli
SURGE=$(realpath "$SURGE")
REPO=$(realpath "$REPO")

WORK=$(mktemp -d /tmp/surge-tools.XXXXXX)
chmod 755 "$WORK"
SHM=$(mktemp -d /dev/shm/surge-tools.XXXXXX)
PLL_PID=""
cleanup() {
    [ -n "$PLL_PID" ] && { fusermount3 -u "$WORK/pll" 2>/dev/null || umount -l "$WORK/pll" 2>/dev/null; kill "$PLL_PID" 2>/dev/null; } || true
    rm -rf "$WORK" "$SHM"
}
trap cleanup EXIT INT TERM

gcc -O2 -o "$WORK/passthrough_ll" /usr/share/doc/libfuse3-dev/examples/passthrough_ll.c \
    $(pkg-config --cflags --libs fuse3) -lpthread 2>"$WORK/pll-build.log" \
    || { echo "cannot build passthrough_ll (libfuse3-dev):" >&2; cat "$WORK/pll-build.log" >&2; exit 1; }
mkdir -p "$SHM/pll-src" "$WORK/pll"
"$WORK/passthrough_ll" -o source="$SHM/pll-src" "$WORK/pll" &
PLL_PID=$!
for _ in $(seq 100); do mountpoint -q "$WORK/pll" && break; sleep 0.05; done
mountpoint -q "$WORK/pll" || { echo "passthrough_ll did not mount" >&2; exit 1; }

TARBALL=$SHM/src.tar
tar -C "$(dirname "$TAR_SRC")" -cf "$TARBALL" "$(basename "$TAR_SRC")"
FILES=$(tar -tf "$TARBALL" | grep -vc '/$')
echo "untar: $FILES files, $(du -h "$TARBALL" | cut -f1) of tar; clone: $REPO" >&2

# The timed commands: DIR is where they run, OUT gets one "name seconds" line each.
cat > "$WORK/tools.sh" <<EOF
#!/bin/bash
set -eu
DIR=\$1 OUT=\$2
t() { python3 -c 'import time; print(time.monotonic())'; }
cd "\$DIR"
a=\$(t); tar -xf "$TARBALL"; b=\$(t)
echo "untar \$(python3 -c "print(\$b - \$a)")" >> "\$OUT"
a=\$(t); git clone -q --no-hardlinks "$REPO" clone; b=\$(t)
echo "clone \$(python3 -c "print(\$b - \$a)")" >> "\$OUT"
a=\$(t); rm -rf "\$DIR"/*; b=\$(t)
echo "rmrf \$(python3 -c "print(\$b - \$a)")" >> "\$OUT"
EOF
chmod 755 "$WORK/tools.sh"
cat > "$WORK/job.sh" <<EOF
#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=4GiB
"$WORK/tools.sh" "\$DW_JOB_STRIPED" "\$JOB_OUT/times"
EOF
chmod 755 "$WORK/job.sh"

RESULTS="$WORK/results"
: > "$RESULTS"
side_raw() {
    local out=$WORK/out-raw; rm -rf "$out"; mkdir -p "$out" "$SHM/raw"
    "$WORK/tools.sh" "$SHM/raw" "$out/times"
    sed "s/^/$1 raw /" "$out/times" >> "$RESULTS"
}
side_pll() {
    local out=$WORK/out-pll; rm -rf "$out"; mkdir -p "$out" "$WORK/pll/t"
    "$WORK/tools.sh" "$WORK/pll/t" "$out/times"
    rmdir "$WORK/pll/t"
    sed "s/^/$1 pll /" "$out/times" >> "$RESULTS"
}
side_job() {
    local out=$WORK/out-job; rm -rf "$out"; mkdir -p "$out"; chmod 777 "$out"
    local env=(SURGE_FAST_DIR="$SHM/fast" SURGE_STATE_DIR="$WORK/state" JOB_OUT="$out")
    if ! (cd "$WORK" && env "${env[@]}" "$SURGE" run "$WORK/job.sh" > "$WORK/job-$1.log" 2>&1); then
        echo "the job failed; its output:" >&2; cat "$WORK/job-$1.log" >&2; exit 1
    fi
    sed "s/^/$1 job /" "$out/times" >> "$RESULTS"
}

for run in $(seq "$RUNS"); do
    if [ $((run % 2)) -eq 1 ]; then order=(raw pll job); else order=(job pll raw); fi
    for side in "${order[@]}"; do "side_$side" "$run"; done
    echo "run $run ($(IFS=,; echo "${order[*]}")): $(grep "^$run " "$RESULTS" | awk '{printf "%s %s %.2fs  ", $2, $3, $4}')" >&2
done

python3 - "$RESULTS" "$RUNS" "$FILES" "$JSON" <<'EOF'
import json, statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
runs, files, out = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
v = {}
for run, side, test, val in rows:
    v.setdefault((side, test), {})[int(run)] = float(val)
tests = ["untar", "clone", "rmrf"]
print(f"\nreal tools: default job vs raw /dev/shm (tmpfs); seconds, medians of {runs} runs; "
      f"untar of {files} files; bar: job/raw <= 3")
print(f"{'test':8} {'raw':>8} {'job':>8} {'pll':>8} {'job/raw':>8} {'pll/raw':>8} {'job/pll':>8}   per run job/raw")
summary = {}
for t in tests:
    raw = statistics.median(v[("raw", t)].values())
    job = statistics.median(v[("job", t)].values())
    pll = statistics.median(v[("pll", t)].values())
    per = [v[("job", t)][r] / v[("raw", t)][r] for r in sorted(v[("job", t)])]
    summary[t] = {"raw_s": raw, "job_s": job, "pll_s": pll, "job_raw": job / raw,
                  "pll_raw": pll / raw, "job_pll": job / pll, "per_run_job_raw": per}
    print(f"{t:8} {raw:8.2f} {job:8.2f} {pll:8.2f} {job / raw:8.2f} {pll / raw:8.2f} {job / pll:8.2f}"
          f"   {' '.join(f'{x:.2f}' for x in per)}")
if out:
    json.dump({"runs": runs, "untar_files": files, "tests": summary}, open(out, "w"), indent=1)
EOF
