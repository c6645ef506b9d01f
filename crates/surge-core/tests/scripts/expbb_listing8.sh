#!/bin/bash
# Modelled on ExPBB Listing 8 (Markomanolis): a job script the auto-tuner generated for 32 BB
# nodes on Shaheen II. The long stage lines are continued the way Slurm reads continuations:
# a trailing `\` and a next line that repeats `#DW`.
#SBATCH --partition=workq
#SBATCH -t 06
#SBATCH -A k01
#SBATCH --ntasks=256
#SBATCH --ntasks-per-node=32
#SBATCH --ntasks-per-socket=16
#SBATCH -J btio
#SBATCH -o btio_out_%j
#SBATCH -e btio_err_%j
#DW jobdw type=scratch access_mode=striped capacity=12704GiB
#DW stage_in type=directory source=/project/k01/markomg/development/expbb \
#DW destination=$DW_JOB_STRIPED
#DW stage_out type=directory destination=/project/k01/markomg/back2 \
#DW source=$DW_JOB_STRIPED

cd $DW_JOB_STRIPED
chmod +x btio
export folder=${SLURM_SUBMIT_DIR}/experiments
export MPICH_MPIO_HINTS="btio.nc"
for (( expbb_io_aggr=32; expbb_io_aggr<=256; expbb_io_aggr=2*$expbb_io_aggr )); do
  export MPICH_MPIO_HINTS="$MPICH_MPIO_HINTS:cb_nodes=$expbb_io_aggr"
  srun -n 256 ./btio
done
