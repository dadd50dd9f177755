#!/bin/sh
# A ddprun worker for the Slurm test: one line with the variables the test checks.
echo "slurm-test-worker RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK GROUP_RANK=$GROUP_RANK NODE=$SLURMD_NODENAME"
