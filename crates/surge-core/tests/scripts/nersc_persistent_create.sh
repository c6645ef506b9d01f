#!/bin/bash
# Creates a persistent instance that later jobs attach (NERSC: "persistent reservation").
#SBATCH --qos=debug
#SBATCH --time=1
#SBATCH --nodes=1
#BB create_persistent name=cosmo capacity=100GB access_mode=striped type=scratch
