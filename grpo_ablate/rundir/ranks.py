"""How many processes this run is, from torchrun's environment or a SLURM job step's.

Outside the training package (train/distributed.py, which needs torch's distributed stack,
asks it too) so that config validation can ask it without reaching into training.
"""
from __future__ import annotations

import os
import subprocess


def launched_ranks() -> int:
    """How many processes torchrun (or SLURM, see below) started for this run (1 otherwise)."""
    slurm_as_torchrun()
    return int(os.environ.get("WORLD_SIZE", "1"))


def this_rank() -> int:
    """This process's rank among them (0 outside torchrun and SLURM job steps)."""
    slurm_as_torchrun()
    return int(os.environ.get("RANK", "0"))


def slurm_as_torchrun() -> None:
    """A SLURM job step with several tasks (e.g. Hydra's submitit_slurm launcher with
    hydra.launcher.tasks_per_node=N and one GPU per task) is one run over its tasks: SLURM's
    task ids become torchrun's variables. Rank 0's node is the rendezvous point, on a port
    derived from the job id (several jobs may share a node)."""
    if "RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return
    master = "127.0.0.1"
    if int(os.environ.get("SLURM_NNODES", "1")) > 1:   # the first host of the job's node list
        master = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]],
                                capture_output=True, text=True, check=True).stdout.split()[0]
    os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"],
                      LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"), MASTER_ADDR=master,
                      MASTER_PORT=str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))
