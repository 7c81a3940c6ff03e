"""Job states for the submitit_slurm launcher on a cluster without accounting.

submitit learns how a job ended from `sacct` (its SlurmInfoWatcher, polled while the sweep
waits). A cluster without accounting (AccountingStorageType=accounting_storage/none: the
local one of scripts/slurm.sh, small clusters) has no sacct to ask: every poll prints
"Slurm accounting storage is disabled" on the console and logs "Bypassing sacct error", for
as long as the sweep runs, and a job that dies without writing its result (SIGKILL) is never
seen to end. There the job states come from `squeue` instead, which lists a job while it is
queued or running and for MinJobAge seconds after it ends; a job it no longer lists has ended
(submitit then reads its result, or reports that it left none).
"""
from __future__ import annotations

import subprocess

from submitit.slurm import slurm as submitit_slurm

ENDED = "ENDED"   # the state of a job that squeue no longer lists (not one of SLURM's own)


class SqueueInfoWatcher(submitit_slurm.SlurmInfoWatcher):
    """submitit's watcher, reading this user's jobs from squeue rather than sacct."""

    def _make_command(self) -> list[str] | None:
        if not self._registered - self._finished:
            return None
        # all of this user's jobs: squeue -j fails outright when one of the ids has left the queue
        return ["squeue", "--me", "--noheader", "--states=all", "--array", "--format=%i|%T|%N"]

    def read_info(self, string) -> dict[str, dict[str, str]]:
        text = string.decode() if isinstance(string, bytes) else string
        info = super().read_info("JobID|State|NodeList\n" + text)
        for job_id in self._registered - self._finished:
            if job_id not in info:
                info[job_id] = {"JobID": job_id, "State": ENDED, "NodeList": ""}
        return info


def accounting_disabled() -> bool:
    """Whether the cluster this machine submits to keeps no accounting (so has no sacct)."""
    try:
        config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                                timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False   # no cluster answers here: submitit's own errors will say so
    return any(line.split("=", 1)[0].strip() == "AccountingStorageType" and line.split("=", 1)[1].strip()
               in ("accounting_storage/none", "(null)", "") for line in config.splitlines() if "=" in line)


def watch_jobs_without_sacct() -> bool:
    """Without accounting, submitit reads job states from squeue (see above). Returns whether
    it does now."""
    if isinstance(submitit_slurm.SlurmJob.watcher, SqueueInfoWatcher):
        return True
    if not accounting_disabled():
        return False
    submitit_slurm.SlurmJob.watcher = SqueueInfoWatcher(delay_s=60)
    return True
