"""How many CPU threads a process takes when nobody said (`threads: null`): the cores nobody else uses.

torch's default is every core. On a machine already busy with other jobs that oversubscribes it, and
torch's threads then wait on each other across cores that others hold: many times slower than one
thread (benchmarks/busy_warmup.py measures it; docs/performance.md). Standard library only: the sweep
plans its share of the cores before it imports torch.
"""
from __future__ import annotations

import math
import os


def cores() -> int:
    """The cores this process may use (its affinity: all of the machine's, or a SLURM allocation, a
    `taskset`, a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # no affinity on this OS (macOS)
        return os.cpu_count() or 1


def others_running() -> float:
    """How many cores other processes keep busy: the 1-minute load average, or the processes runnable
    right now besides this one where that is more (the average lags a minute behind jobs just started)."""
    try:
        with open("/proc/loadavg") as f:   # "0.52 0.58 0.59 3/115 4242": load over 1, 5, 15 min; runnable now
            fields = f.read().split()
        return max(float(fields[0]), int(fields[3].split("/")[0]) - 1)
    except (OSError, IndexError, ValueError):           # no /proc (macOS): the average alone
        try:
            return os.getloadavg()[0]
        except OSError:
            return 0.0


def free_cores() -> int:
    """The cores of this process that nobody else keeps busy, at least 1. A process held to fewer cores
    than the machine has (a SLURM allocation, `taskset`, a cpuset) owns them: all of them. Otherwise the
    machine's cores less what others run (`others_running`), rounded to the nearest core."""
    mine, machine = cores(), os.cpu_count() or 1
    if mine < machine:
        return mine
    return max(1, min(mine, math.floor(machine - others_running() + 0.5)))


def cpu_threads(threads: int | None) -> int:
    """The torch threads of a run: `threads` where it is set, else OMP_NUM_THREADS where that is set (the
    user's own limit), else the free cores."""
    if threads:
        return int(threads)
    given = os.environ.get("OMP_NUM_THREADS", "")
    return int(given) if given.isdigit() and int(given) > 0 else free_cores()
