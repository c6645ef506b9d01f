#!/bin/bash
# Modelled on Daley §4.3: CAMP-builddb on 64 nodes with a private namespace per compute node
# (12,800 GiB = 64 fragments of 200 GiB, one metadata server per node) and the Python
# environment in a persistent instance shared by all jobs.
#SBATCH -N 64
#SBATCH -C haswell
#SBATCH -t 00:30:00
#DW persistentdw name=camp_env
#DW jobdw type=scratch access_mode=private capacity=12800GiB pool=wlm_pool
#DW stage_in type=list source=/global/cscratch1/sd/camp/swaths.list destination=$DW_JOB_PRIVATE/swaths

export PYTHONUSERBASE=$DW_PERSISTENT_STRIPED_camp_env/python
srun -N 64 -n 64 python builddb.py --db $DW_JOB_PRIVATE/camp.sqlite --swaths $DW_JOB_PRIVATE/swaths
