"""Which process of a multi-process launch writes: rank 0 alone.

``accelerate launch``, ``torchrun`` and ``deepspeed`` start one copy of a stage per process; every copy runs the
stage top to bottom, so the Trainer's collectives (gradient all-reduce, ZeRO-3's gather when saving) see every rank.
The stage's own side effects are another matter: each copy would open its own MLflow run and swap the same
output directories in at once. So the two places every stage writes through are guarded here:

- ``posttrain.atomic``: on ranks other than 0, ``atomic_dir`` hands out a throwaway directory (the rank still
  takes part in ``Trainer.save_model``'s gather, but nothing it writes is kept) and ``atomic_write_*`` write
  nothing; every rank then waits for rank 0's swap, so an output read back after it is rank 0's, whole.
- ``posttrain.tracking``: ranks other than 0 log to a throwaway MLflow store (the stages call ``mlflow.log_*``
  directly, and with no run of their own MLflow would start one in the real store).

The rank is read from the launcher's environment, as Accelerate reads it, before any process group exists: a stage
opens its MLflow run before the Trainer initialises torch.distributed.

The RL stages' rollouts span the processes (``posttrain.rlvr``, ``posttrain.rlhf``): one rollout, one replay
buffer and one routing budget per step, whatever the number of processes.
"""
from __future__ import annotations

from accelerate.utils import get_int_from_env

# the launchers' rank variables, in Accelerate's order (torchrun / accelerate / deepspeed, then MPI's)
RANK_ENV = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK"]
WORLD_SIZE_ENV = ["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"]


def process_rank() -> int:
    """This process's global rank in a multi-process launch; 0 when launched alone."""
    return get_int_from_env(RANK_ENV, 0)


def is_main_process() -> bool:
    return process_rank() == 0


def world_size() -> int:
    """How many processes the launch started; 1 when launched alone."""
    return get_int_from_env(WORLD_SIZE_ENV, 1)


def wait_for_everyone() -> None:
    """A barrier across the launch's processes once torch.distributed is up (the Trainer brings it up); else
    nothing, so a stage run alone, or before training starts, never waits."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
