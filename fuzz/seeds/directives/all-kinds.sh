#!/bin/bash
#SBATCH -N 2
#DW jobdw type=scratch access_mode=striped,private capacity=2TiB pool=default
#DW persistentdw name=shared_env
#DW stage_in type=directory source=/pfs/in destination=$DW_JOB_STRIPED/in
#DW stage_in type=file source=/pfs/one.dat destination=$DW_JOB_STRIPED/one.dat
#DW stage_in type=list source=/pfs/list.txt
#DW stage_out type=directory source=$DW_JOB_STRIPED/out destination=/pfs/out
#DW stage_out type=file source=$DW_PERSISTENT_STRIPED_shared_env/log destination=/pfs/log
#SURGE jobdw bandwidth=4GiB/s iops=200k metadata=50k/s capacity=100GiB access_mode=striped
srun ./a.out $DW_JOB_STRIPED $DW_JOB_PRIVATE
