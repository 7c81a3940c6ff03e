"""A run stopped from outside (SLURM's time limit, `scancel`, preemption, SIGTERM, Ctrl-C): status
`interrupted`, resumed from its checkpoint, never started over as a `failed` run is. The signal
becomes RunInterrupted (a BaseException: no `except Exception` swallows it); SIGUSR2, submitit's
early warning, is only noted. Torch-free: the report and the sweep read the state name from here.
Design: docs/slurm.md ("How a stop is recorded")
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

INTERRUPTED = "interrupted"
# how long a stopped sweep waits for its runs to record `interrupted` before it kills what is left
# (recording a status takes well under a second; a torch op in flight finishes first)
STOP_GRACE_S = 8.0


class RunInterrupted(BaseException):
    """The process was asked to stop (SIGTERM); `reason` says by whom, as far as is known."""

    def __init__(self, reason: str, signum: int):
        super().__init__(reason)
        self.reason, self.signum = reason, signum

    def resend(self) -> None:
        """Now that the run's status is written, the signal does what it would have done (ends a
        plain process; submitit's job process ignores it and returns its result). Ctrl-C goes on
        as Python's KeyboardInterrupt: the CLI's cleanup runs, and a sweep running this run in its own
        process records it; the CLI ends with 130 and no traceback."""
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), self.signum)


def how_it_ended(err: BaseException) -> tuple[str, str]:
    """The status a run records when `err` ends it: (interrupted, why) for a stop from outside,
    (failed, the exception in one line) for anything else."""
    if isinstance(err, RunInterrupted):
        return INTERRUPTED, err.reason
    return "failed", f"{type(err).__name__}: {err}".strip()


@contextmanager
def stop_on_signals():
    """SIGTERM and SIGINT (Ctrl-C: treated alike, so the run is `interrupted` and resumes from its
    checkpoint, not `failed` and started over) raise RunInterrupted in the main thread while the
    block runs (once: a second signal while the status is written is ignored); in a SLURM job, SIGUSR2 is noted. The
    previous handlers are back afterwards. Elsewhere than the main thread: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    warned = []

    def on_term(signum, frame):
        signal.signal(signum, signal.SIG_IGN)
        raise RunInterrupted(stop_reason(signum, warned=bool(warned)), signum)

    handlers = {signal.SIGTERM: on_term, signal.SIGINT: on_term}
    if os.environ.get("SLURM_JOB_ID"):
        handlers[signal.SIGUSR2] = lambda signum, frame: warned.append(signum)
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextmanager
def stop_workers_on_signals(still_training: Callable[[], bool], grace_s: float = STOP_GRACE_S):
    """In a sweep process whose runs train in worker processes: SIGTERM or SIGINT is passed on to
    every process the sweep started (each run records `interrupted`: stop_on_signals), the sweep
    waits until `still_training()` is false (or `grace_s` passed), kills whatever of its processes
    is left (idle workers, a run that did not stop), then raises
    RunInterrupted here. The previous handlers are back afterwards."""
    def on_stop(signum, frame):
        for sig in previous:   # a second Ctrl-C does not cut the wait for the runs short
            signal.signal(sig, signal.SIG_IGN)
        _signal_each(descendants(), signum)
        deadline = time.monotonic() + grace_s
        while still_training() and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(3):     # a worker started while the others were stopping is ended too
            left = [pid for pid in descendants() if not _resource_tracker(pid)]
            if not left:
                break
            _signal_each(left, signal.SIGKILL)
            time.sleep(0.2)
        raise RunInterrupted(stop_reason(signum), signum)

    previous = {sig: signal.signal(sig, on_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def descendants(pid: int | None = None) -> list[int]:
    """The live processes started by `pid` (this process), their children, and so on, from /proc
    (none where there is no /proc). Zombies are left out: they have ended, only their exit
    status waits to be read."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()   # after "pid (comm)": state, ppid, ...
        except (OSError, IndexError):
            continue                                               # it ended while being read
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [os.getpid() if pid is None else pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _resource_tracker(pid: int) -> bool:
    """loky's (or multiprocessing's) resource tracker: it ends by itself once the sweep has, after
    freeing what the workers left; killed earlier, the sweep starts another that reports tracebacks."""
    try:
        return b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _signal_each(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:      # it ended meanwhile
            pass


def stop_reason(signum: int, warned: bool = False) -> str:
    """Why this process got `signum`: SLURM's time limit, SLURM otherwise (scancel,
    preemption), or just the signal's name outside SLURM."""
    name = signal.Signals(signum).name
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return name
    job = slurm_job_label()
    fields = slurm_job_fields(job_id)
    if fields.get("Reason") == "TimeLimit" or (not fields and warned):
        limit = fields.get("TimeLimit")
        return f"SLURM time limit ({limit + ', ' if limit else ''}job {job})"
    because = fields.get("Reason")
    return (f"stopped by SLURM ({name}, job {job}: scancel or preemption"
            + (f", reason {because}" if because and because != "None" else "") + ")")


def slurm_job_label() -> str:
    """The job as squeue shows it: 12, or 12_3 for a task of a job array."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array_job}_{task}" if array_job and task else os.environ.get("SLURM_JOB_ID", "?")


def slurm_job_fields(job_id: str) -> dict[str, str]:
    """`scontrol show job`'s Key=Value fields ({} when scontrol cannot answer in 10 s)."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", str(job_id)], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return dict(re.findall(r"(?:^|\s)(\w+)=(\S*)", out))
