#!/bin/bash
# In the style of NERSC's Cori burst-buffer examples: a job instance, one input file staged
# in, an output directory staged out.
#SBATCH --qos=debug
#SBATCH --time=5
#SBATCH --nodes=2
#SBATCH --constraint=haswell
#DW jobdw capacity=10GB access_mode=striped type=scratch
#DW stage_in source=/global/cscratch1/sd/alice/input.h5 destination=$DW_JOB_STRIPED/input.h5 type=file
#DW stage_out source=$DW_JOB_STRIPED/output destination=/global/cscratch1/sd/alice/output type=directory
mkdir $DW_JOB_STRIPED/output
srun ./analyse ${DW_JOB_STRIPED}/input.h5 ${DW_JOB_STRIPED}/output
