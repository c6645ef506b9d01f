#!/bin/bash
# Time from `sbatch` to the job running, for a #DW job with an empty stage-in against the same
# job without #DW lines, on the many-host test bed (contrib/slurm/testbed.sh), plus what each
# burst-buffer hook (`surge bb <phase>`) took, as burst_buffer.lua logs it. Run as root.
#
#   bench/slurm_phases.sh [--runs N]        (default 5 runs of each, alternating which goes first)
#
# Prints one line per job and a summary: median sbatch->RUNNING of each kind, their ratio, and
# the median ms of each phase. The test bed is brought up if needed and left up (take it down
# with contrib/slurm/testbed.sh down).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=5
while [ $# -gt 0 ]; do
    case $1 in
        --runs) RUNS=$2; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
TB=/run/surge-tb
export SLURM_CONF=$TB/etc/slurm.conf
USER_=${TB_USER:-sgbbuser}
contrib/slurm/testbed.sh up >/dev/null
cat > $TB/pfs/bench-dw.sh <<'JOB'
#!/bin/bash
#SBATCH -N 2
#DW jobdw type=scratch access_mode=striped capacity=1GiB pool=nvme
true
JOB
cat > $TB/pfs/bench-plain.sh <<'JOB'
#!/bin/bash
#SBATCH -N 2
true
JOB
chmod 644 $TB/pfs/bench-*.sh

# sbatch -> first time squeue says R (or the job is gone), polled every 20 ms.
one() { # one KIND -> prints "KIND ID SECONDS"
    local kind=$1 t0 id st
    t0=$(date +%s.%N)
    id=$(runuser -u "$USER_" -- env SLURM_CONF=$SLURM_CONF sbatch --parsable -o /dev/null -D $TB/pfs $TB/pfs/bench-$kind.sh)
    while :; do
        st=$(squeue -h -j "$id" -o %T 2>/dev/null || true)
        case $st in RUNNING|COMPLETING|"") break ;; esac
        sleep 0.02
    done
    awk -v a="$t0" -v b="$(date +%s.%N)" -v k="$kind" -v i="$id" 'BEGIN{printf "%s %s %.2f\n", k, i, b-a}'
    # let it leave the queue (and its teardown end) before the next one
    while squeue -h -j "$id" 2>/dev/null | grep -q .; do sleep 0.1; done
}
results=$(mktemp)
for r in $(seq 1 "$RUNS"); do
    if [ $((r % 2)) = 1 ]; then order="dw plain"; else order="plain dw"; fi
    for k in $order; do one $k | tee -a "$results"; done
done
sleep 1
median() { sort -n | awk '{a[NR]=$1} END{if(NR==0){print "nan"; exit} m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; print m}'; }
dw=$(awk '$1=="dw"{print $3}' "$results" | median)
plain=$(awk '$1=="plain"{print $3}' "$results" | median)
echo "median sbatch->RUNNING: #DW job ${dw} s, no #DW ${plain} s, ratio $(awk -v a="$dw" -v b="$plain" 'BEGIN{printf "%.2f", a/b}')"
ids=$(awk '$1=="dw"{print $2}' "$results")
echo "median per phase (ms, as burst_buffer.lua measured the surge bb command):"
for p in setup data_in paths pre_run post_run data_out teardown; do
    ms=$(for i in $ids; do grep -o "surge bb $p job=$i ([0-9]* ms)" $TB/log/slurmctld.log | grep -o '([0-9]*' | tr -d '('; done | median)
    printf "  %-9s %s\n" "$p" "$ms"
done
rm -f "$results"
