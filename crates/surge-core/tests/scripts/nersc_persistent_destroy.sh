#!/bin/bash
# Destroys the persistent instance without waiting for pending stage-outs.
#SBATCH --qos=debug
#SBATCH --time=1
#SBATCH --nodes=1
#BB destroy_persistent name=cosmo hurry
