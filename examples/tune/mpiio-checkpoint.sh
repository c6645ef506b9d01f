#!/bin/bash
#DW jobdw type=scratch access_mode=striped capacity=256MiB
#DW stage_in type=file source=params.nml destination=$DW_JOB_STRIPED/params.nml
#DW stage_out type=directory source=$DW_JOB_STRIPED/ckpt destination=ckpt-out
# An MPI-IO checkpoint (IOR's MPIIO pattern): 4 ranks write one shared file with collective
# I/O and read it back; the file is kept and staged out. `surge tune` searches fragments,
# access mode, whether params.nml stays on the PFS, and the ROMIO hints of the run.
#   cd examples/tune && echo "&run n=1 /" > params.nml && surge tune mpiio-checkpoint.sh
set -e
cat "$DW_JOB_STRIPED/params.nml" > /dev/null
mkdir -p "$DW_JOB_STRIPED/ckpt"
"${SURGE:-surge}" bench io "$DW_JOB_STRIPED/ckpt" --backend mpiio -n 4 --shared-file --collective \
    -t 1MiB -b 16MiB -k > /dev/null
