#!/bin/bash
# ExPBB Listing 8 as the paper prints it: the continuation lines do not start with `#DW`.
# For bash they are commands (variable assignments); for Slurm the directives end there and
# the stage_out is silently dropped. Surge rejects the script and says why.
#SBATCH --partition=workq
#SBATCH --ntasks=256
#SBATCH -J btio
#DW jobdw type=scratch access_mode=striped capacity=12704GiB
#DW stage_in type=directory source=/project/k01/markomg/development/expbb \
destination=$DW_JOB_STRIPED
#DW stage_out type=directory destination=/project/k01/markomg/back2 \
source=$DW_JOB_STRIPED

cd $DW_JOB_STRIPED
srun -n 256 ./btio
