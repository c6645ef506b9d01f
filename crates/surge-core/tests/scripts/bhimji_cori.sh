#!/bin/bash
# The directives of Bhimji et al. §2.3 (NERSC Cori): keys in any order, a relative source and
# destination on the PFS, and a file staged into the instance's root directory.
#SBATCH -N 2
#DW jobdw capacity=1000GB access_mode=striped type=scratch
#DW stage_in source=file.dat destination=$DW_JOB_STRIPED/ type=file
#DW stage_out source=$DW_JOB_STRIPED/out destination=out type=directory
srun my.x --infile=$DW_JOB_STRIPED/file.dat --outdir=$DW_JOB_STRIPED/out
