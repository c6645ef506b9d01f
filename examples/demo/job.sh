#!/bin/bash
# A DataWarp-style batch script: Surge runs it unchanged (`surge run job.sh`), as would Slurm
# with DataWarp. It stages a directory of mixed inputs into the job's burst-buffer instance,
# transforms them there, and stages the results back out.
#SBATCH --job-name=surge-demo
#SBATCH --nodes=1
#DW jobdw type=scratch access_mode=striped capacity=2GiB
#DW stage_in type=directory source=demo-inputs destination=$DW_JOB_STRIPED/in
#DW stage_out type=directory source=$DW_JOB_STRIPED/out destination=demo-results
set -euo pipefail

in=$DW_JOB_STRIPED/in
out=$DW_JOB_STRIPED/out
mkdir -p "$out/small"

# Large files: one combined product and a checksum per input.
cat "$in"/large/*.dat >"$out/combined.dat"
for f in "$in"/large/*.dat; do
    sha256sum <"$f" | cut -d' ' -f1 >"$out/$(basename "$f").sha256"
done

# Small files: transform each one.
for f in "$in"/small/*.txt; do
    tr 'a-z' 'A-Z' <"$f" >"$out/small/$(basename "$f")"
done

echo "demo job: $(ls "$in/small" | wc -l) small and $(ls "$in/large" | wc -l) large inputs transformed on $DW_JOB_STRIPED"
