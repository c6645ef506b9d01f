#!/bin/bash
# fsstress (xfstests, built by `make setup`) inside a type=cache job, then the tree the job saw
# against the tree the drain left on the PFS: every directory, file and symlink with its mode,
# size and sha256, and the hard-link groups (FIFOs, sockets and devices stay on the fast tier
# by design and are not compared). Exit 0 when they are identical, 1 with the differences.
#
#   bench/cache_fsstress.sh [--ops 600] [--procs 2] [--seed 7] [--pfs DIR] [--keep]
#
# --pfs: the PFS directory (default /var/tmp/surge-cache-fsstress; contrib/netpfs or
# contrib/slowpfs directories work too); emptied first, removed at the end unless --keep.
# fsstress makes sparse files of up to a few GB: hashing them takes minutes with --procs 4
# --ops 3000 (the run that found the hard-link bug of 2026-11-27). Needs root (FUSE) or the
# passthrough helper; SURGE=<surge binary> (default target/release/surge).
set -euo pipefail
cd "$(dirname "$0")/.."
OPS=600 PROCS=2 SEED=7 PFS=/var/tmp/surge-cache-fsstress KEEP=0
while [ $# -gt 0 ]; do
    case $1 in
        --ops) OPS=$2; shift 2 ;;
        --procs) PROCS=$2; shift 2 ;;
        --seed) SEED=$2; shift 2 ;;
        --pfs) PFS=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) sed -n 2,15p "$0"; exit 0 ;;
        *) echo "cache_fsstress.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
SURGE=${SURGE:-target/release/surge}
[ -x "$SURGE" ] || cargo build --release -p surge-cli
FSSTRESS=$(pwd)/.tools/bin/fsstress
[ -x "$FSSTRESS" ] || { echo "cache_fsstress.sh: $FSSTRESS is missing: run 'make setup'" >&2; exit 2; }
WORK=$(mktemp -d /tmp/surge-cache-fsstress.XXXXXX)
rm -rf "$PFS"; mkdir -p "$PFS"
cat > "$WORK/job.sh" <<JOB
#!/bin/bash
#DW jobdw type=cache access_mode=striped capacity=2GiB pfs=$PFS
$FSSTRESS -d \$DW_JOB_STRIPED_CACHE/s -n $OPS -p $PROCS -s $SEED -v > $WORK/fsstress.log 2>&1
python3 $(pwd)/bench/lib/tree_manifest.py \$DW_JOB_STRIPED_CACHE > $WORK/inside
JOB
"$SURGE" run "$WORK/job.sh" 2>&1 | grep -E 'surge run: (job|drain|stage-out)' || true
python3 bench/lib/tree_manifest.py "$PFS" > "$WORK/pfs"
# Special files (O lines) stay on the fast tier.
diff <(grep -v '^O ' "$WORK/inside") <(grep -v '^O ' "$WORK/pfs") > "$WORK/diff" || true
n=$(grep -c '^[<>]' "$WORK/diff" || true)
echo "fsstress -n $OPS -p $PROCS -s $SEED: $(grep -c . "$WORK/inside") entries in the job, $n line(s) differ on the PFS"
[ "$n" -eq 0 ] || { head -40 "$WORK/diff"; echo "(fsstress log: $WORK/fsstress.log)"; }
[ "$KEEP" = 1 ] || rm -rf "$PFS"
[ "$n" -eq 0 ] && rm -rf "$WORK"
[ "$n" -eq 0 ]
