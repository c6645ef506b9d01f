#!/bin/bash
#SBATCH -N 4
#DW jobdw type=scratch access_mode=striped capacity=10XB
#DW jobdw type=cache access_mode=striped capacity=1TiB
#DW persistentdw name=9lives
#DW stage_in type=file source=/pfs/in.dat destination=/pfs/elsewhere/in.dat
#DW stage_out type=directory source=$DW_PERSISTENT_STRIPED_results/out destination=$SCRATCH/out
#DW swap 4GiB
srun ./app
#DW stage_out type=directory source=$DW_JOB_STRIPED/late destination=/pfs/late
