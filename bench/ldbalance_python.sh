#!/bin/bash
# A Python software environment (numpy + scipy from PyPI) imported on several emulated compute
# nodes from an access_mode=ldbalance instance, against the same import from /dev/shm (the raw
# fast tier), from the PFS directory (cold: its pages dropped first) and from a striped
# instance (the same stage-in, no replicas, no long kernel caches). Issue 16's bar: ldbalance
# within 1.5x of /dev/shm and well under the PFS.
#
#   bench/ldbalance_python.sh [--runs N] [--nodes N] [--pfs DIR] [--imports 'numpy, scipy']
#
# Every side is timed as the wall time of `python3 -c 'import ...'` (interpreter start
# included: it is the same /usr/bin/python3 everywhere), first import on each node (cold for
# that node's mount) and the median of the repeats. The order of the sides alternates from
# run to run. SURGE=<surge binary> (default target/release/surge, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=3 NODES=2 PFS="" REPEATS=5
IMPORTS="numpy, scipy, scipy.linalg, scipy.sparse, scipy.optimize, scipy.stats"
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        --nodes) NODES=$2; shift 2 ;;
        --pfs) PFS=$2; shift 2 ;;
        --imports) IMPORTS=$2; shift 2 ;;
        -h|--help) sed -n 2,16p "$0"; exit 0 ;;
        *) echo "ldbalance_python.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
SURGE=${SURGE:-target/release/surge}
[ -x "$SURGE" ] || cargo build --release -p surge-cli
# The PFS: contrib/netpfs (GlusterFS over a shaped, delayed link: a PFS's per-operation
# latency) when it is up, else contrib/slowpfs (a throttled disk), else a directory on disk.
if [ -z "$PFS" ]; then
    if mountpoint -q /run/surge-netpfs/pfs 2>/dev/null; then PFS=/run/surge-netpfs/pfs/pyenv
    elif mountpoint -q /run/surge-slowpfs/pfs 2>/dev/null; then PFS=/run/surge-slowpfs/pfs/pyenv
    else PFS=/var/tmp/surge-bench-pfs/pyenv; fi
fi
NETPFS=0
case $PFS in /run/surge-netpfs/pfs/*) NETPFS=1 ;; esac
VENV=/var/tmp/surge-bench-pyenv
if ! "$VENV/bin/python3" -c 'import numpy, scipy' 2>/dev/null; then
    echo "installing numpy and scipy from PyPI into $VENV ..." >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q numpy scipy
fi
SP=$("$VENV/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
SHM=/dev/shm/surge-bench-pyenv
mkdir -p "$PFS" "$SHM"
[ -f "$PFS/.complete" ] || { cp -a "$SP/." "$PFS/"; touch "$PFS/.complete"; }
cp -a "$SP/." "$SHM/"
FILES=$(find "$SHM" -type f | wc -l)
SIZE=$(du -sh "$SHM" | cut -f1)
echo "environment: numpy + scipy, $FILES files, $SIZE; imports: $IMPORTS; $NODES nodes"
echo "PFS: $PFS"

# Drops the PFS copy's pages from the page cache (this directory only: no global drop_caches);
# on contrib/netpfs, remounts its client (GlusterFS caches names and attributes too).
drop_pfs() {
    if [ $NETPFS = 1 ]; then contrib/netpfs/netpfs.sh cold; return; fi
    python3 - "$PFS" <<'EOF'
import os, sys
for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        try:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        except OSError:
            pass
EOF
}

# One node's work: the first import, then REPEATS more; prints "NODE first median".
NODE_LOOP='t() { local a b; a=$(date +%s%N); python3 -c "import $IMPORTS" >/dev/null; b=$(date +%s%N); echo $(( (b - a) / 1000000 )); }
f=$(t); r=(); for i in $(seq 1 $REPEATS); do r+=($(t)); done
echo "NODE $f $(printf "%s\n" "${r[@]}" | sort -n | sed -n "$(( (REPEATS + 1) / 2 ))p")"'

# A side on a plain directory: NODES processes at once (as the nodes of a job would), each
# with PYTHONPATH=$1; prints "first median" averaged over them.
plain() {
    local out; out=$(mktemp /tmp/surge-ldb-plain.XXXXXX)
    for _ in $(seq 1 "$NODES"); do
        PYTHONPATH=$1 IMPORTS=$IMPORTS REPEATS=$REPEATS bash -c "$NODE_LOOP" >> "$out" &
    done
    wait
    awk '/^NODE/ { f += $2; m += $3; n++ } END { printf "%d %d\n", f / n, m / n }' "$out"
    rm -f "$out"
}

# The same inside a surge run job of access mode $1, on every node at once; prints
# "first median" averaged over the nodes.
instance() {
    local mode=$1 var job out
    var=DW_JOB_STRIPED; [ "$mode" = ldbalance ] && var=DW_JOB_LDBAL
    job=$(mktemp /tmp/surge-ldb-job.XXXXXX)
    out=$(mktemp /tmp/surge-ldb-out.XXXXXX)
    printf '%s\n' "$NODE_LOOP" > "$job.node"
    cat > "$job" <<EOF
#!/bin/bash
#DW jobdw type=scratch access_mode=$mode capacity=1GiB
#DW stage_in type=directory source=$PFS destination=\$$var/sp
surge exec --all bash -c 'PYTHONPATH=\$$var/sp IMPORTS="$IMPORTS" REPEATS=$REPEATS bash $job.node' >> $out
EOF
    "$SURGE" run -q --nodes "$NODES" "$job" >/dev/null
    awk '/^NODE/ { f += $2; m += $3; n++ } END { printf "%d %d\n", f / n, m / n }' "$out"
    rm -f "$job" "$job.node" "$out"
}

declare -A FIRST MED
sides=(shm pfs ldbalance striped)
for run in $(seq 1 "$RUNS"); do
    order=("${sides[@]}")
    [ $((run % 2)) -eq 0 ] && order=(striped ldbalance pfs shm)
    line="run $run:"
    for side in "${order[@]}"; do
        case $side in
            shm) r=$(plain "$SHM") ;;
            pfs) drop_pfs; r=$(plain "$PFS") ;;
            ldbalance) r=$(instance ldbalance) ;;
            striped) r=$(instance striped) ;;
        esac
        FIRST[$side]+="${r% *} "
        MED[$side]+="${r#* } "
        line+=" $side ${r% *}/${r#* } ms"
    done
    echo "$line   (first/median of $REPEATS)"
done

median() { printf '%s\n' $1 | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
echo
printf '%-10s %12s %12s %14s %14s\n' side "first ms" "repeat ms" "first / shm" "repeat / shm"
s1=$(median "${FIRST[shm]}"); s2=$(median "${MED[shm]}")
for side in shm pfs ldbalance striped; do
    a=$(median "${FIRST[$side]}"); b=$(median "${MED[$side]}")
    printf '%-10s %12s %12s %14s %14s\n' "$side" "$a" "$b" \
        "$(awk -v a="$a" -v b="$s1" 'BEGIN { printf "%.2f", a / b }')" \
        "$(awk -v a="$b" -v b="$s2" 'BEGIN { printf "%.2f", a / b }')"
done
rm -rf "$SHM"
