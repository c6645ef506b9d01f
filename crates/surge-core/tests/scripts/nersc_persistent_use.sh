#!/bin/bash
# Attaches the persistent instance, stages a directory into it and results out of it.
#SBATCH --qos=debug
#SBATCH --time=5
#SBATCH --nodes=1
#DW persistentdw name=cosmo
#DW stage_in source=/global/cscratch1/sd/alice/universe destination=$DW_PERSISTENT_STRIPED_cosmo/universe type=directory
#DW stage_out source=$DW_PERSISTENT_STRIPED_cosmo/outfiles destination=/global/cscratch1/sd/alice/outfiles type=directory
ls $DW_PERSISTENT_STRIPED_cosmo/
