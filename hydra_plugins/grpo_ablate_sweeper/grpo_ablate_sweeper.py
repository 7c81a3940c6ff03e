"""A thin Hydra sweeper: it launches a job list that `grpo-ablate sweep` already built.

The matrix (which tricks are on in which run) is plain Python in `grpo_ablate.sweep`; this
plugin only hands it to whichever Hydra launcher is configured (basic, joblib, submitit,
ray) and records how every job ended. Unlike Hydra's basic sweeper it never re-raises a
failed job's exception, so one crashed run never stops the others; `grpo-ablate sweep` turns
the recorded outcomes into its exit code.

Hydra imports every plugin at start-up: keep this module free of torch and of grpo_ablate.
`hydra_plugins/` is a namespace package and must have no `__init__.py`; no
`from __future__ import annotations` either (Hydra executes plugin modules outside
sys.modules, where dataclasses cannot resolve string annotations).
"""
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobStatus
from hydra.plugins.sweeper import Sweeper


@dataclass
class GrpoAblateSweeperConf:
    _target_: str = "hydra_plugins.grpo_ablate_sweeper.grpo_ablate_sweeper.GrpoAblateSweeper"
    # JSON written by `grpo-ablate sweep`: [{"name": run name, "overrides": [...]}, ...]
    jobs_file: str = "???"
    # where the outcome of every job is recorded, rewritten atomically after each batch
    results_file: str = "???"
    # jobs handed to the launcher at once; null = all of them (a parallel launcher's pool
    # then schedules them). 1 with the in-process basic launcher records each run as it ends.
    max_batch_size: Optional[int] = None


def store_config() -> None:
    ConfigStore.instance().store(group="hydra/sweeper", name="grpo_ablate", node=GrpoAblateSweeperConf,
                                 provider="grpo_ablate")


store_config()   # when Hydra's plugin scan runs this module (an installed wheel)


def register() -> None:
    """Make `hydra/sweeper=grpo_ablate` and its class known to Hydra. `grpo-ablate sweep` calls
    this because an editable install hides the module from Hydra's plugin scan (pkgutil
    cannot list setuptools' editable finder)."""
    from hydra.core.plugins import Plugins

    store_config()
    Plugins.instance().register(GrpoAblateSweeper)


class GrpoAblateSweeper(Sweeper):
    def __init__(self, jobs_file: str, results_file: str, max_batch_size: Optional[int] = None):
        self.jobs_file, self.results_file = Path(jobs_file), Path(results_file)
        self.max_batch_size = max_batch_size
        self.launcher = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: List[str]) -> Any:
        jobs = json.loads(self.jobs_file.read_text())
        size = self.max_batch_size or len(jobs) or 1
        results = {}
        returns = []
        for start in range(0, len(jobs), size):
            batch = jobs[start:start + size]
            # the run dir of every job is named by its variant and seed, not by a job number
            overrides = [[*arguments, *job["overrides"], f"hydra.sweep.subdir={job['name']}"]
                         for job in batch]
            for job, ret in zip(batch, self.launcher.launch(overrides, initial_job_idx=start)):
                results[job["name"]] = _outcome(ret)
                returns.append(ret)
            _atomic_write(self.results_file, json.dumps(results, indent=2) + "\n")
        return returns


def _outcome(ret) -> dict:
    """How a job ended, without re-raising a failed job's exception (Hydra's JobReturn.
    return_value would)."""
    if ret.status == JobStatus.COMPLETED:
        return {"status": "returned", "exit_code": ret._return_value}
    error = ret._return_value
    return {"status": "raised", "error": f"{type(error).__name__}: {error}"[:500]}


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
