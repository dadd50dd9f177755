"""ddprun's worker contract, the Python side: the names common/include/ddp/common/
worker_contract.hpp gives, mirrored name for name (tests/worker/contract_test.cpp checks that
the two agree). Only names: importing it opens nothing and reads nothing."""

# ddprun's own variables, set for a worker by the agent.
RECORD_FD = "DDPRUN_RECORD_FD"  # the collective record page, an inherited memfd
STACK_FD = "DDPRUN_STACK_FD"  # the file every thread's stack is written into
STACK_SIGNAL = "DDPRUN_STACK_SIGNAL"  # the signal that asks for it
MODULES_FILE = "DDPRUN_MODULES_FILE"  # where the modules the worker imported are written
USER_PYTHONPATH = "DDPRUN_PYTHONPATH"  # the user's PYTHONPATH, put back by sitecustomize
FR_OLD_NAMES = "DDPRUN_FR_OLD_NAMES"  # Flight Recorder variables to drop where PyTorch warns
TEMPLATE_FD = "DDPRUN_TEMPLATE_FD"  # the warm template's end of its socket pair
TEMPLATE_PAD = "DDPRUN_TEMPLATE_PAD"  # room for a forked worker's environment
INPLACE_GENERATION = "DDPRUN_INPLACE_GENERATION"  # --restart_policy=inplace: the generation
# Set by the user, read by ddprun: "0" turns the probe, or the NCCL plugin, off.
PYTHON_PROBE = "DDPRUN_PYTHON_PROBE"
NCCL_PROFILER = "DDPRUN_NCCL_PROFILER"

# The warm template's protocol: each message's kind (OP), the requests and their answers.
OP = "op"
PREPARE = "prepare"  # answered by PREPARED
PREPARED = "prepared"
SPAWN = "spawn"  # answered by SPAWNED, or COLD when it must not fork
SPAWNED = "spawned"
COLD = "cold"
