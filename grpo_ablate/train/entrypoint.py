"""The Hydra entrypoint behind `grpo-ablate train` (also `python -m grpo_ablate.train.entrypoint`).

Hydra owns the run dir (`hydra.run.dir`, or one per job under `hydra.sweep.dir` with -m),
composes the config from `grpo_ablate.conf`, sets up logging, and calls `hydra_train` once
per job with any launcher.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from rich.console import Console

from grpo_ablate.config.compose import listed_since
from grpo_ablate.errors import ConfigError
from grpo_ablate.models import ModelPathError
from grpo_ablate.rundir.files import find_checkpoint
from grpo_ablate.rundir.lock import release_all_locks
from grpo_ablate.rundir.paths import hydra_unquoted
from grpo_ablate.rundir.stopping import RunInterrupted, stop_on_signals
from grpo_ablate.train.controls import run_control
from grpo_ablate.train.grpo import train
from grpo_ablate.train.run import EXIT_BAD_INPUT

# exit code of the last job run in this process (Hydra itself returns nothing)
_last_exit_code = 0


@hydra.main(config_path="pkg://grpo_ablate.conf", config_name="config", version_base="1.3")
def hydra_train(cfg: DictConfig) -> int:
    global _last_exit_code
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    overrides = list(HydraConfig.get().overrides.task)
    console = Console(soft_wrap=True)  # paths stay on one line, copy-pasteable
    in_sweep = cfg.get("sweep", {}).get("id") is not None   # many runs: one line each, no progress
    prefix = f"[{cfg.run.name}] " if in_sweep else ""
    run = train if cfg.control.name == "none" else run_control   # a no-RL control run
    try:
        with stop_on_signals():   # SIGTERM (SLURM's time limit, scancel): the run records `interrupted`
            result = run(cfg, run_dir, overrides=overrides, console=None if in_sweep else console)
    except RunInterrupted as stop:
        release_all_locks()   # the signal is resent below: this process ends past the CLI's `finally`
        if os.environ.get("RANK", "0") == "0":
            given_dir = [o for o in HydraConfig.get().overrides.hydra if o.startswith("hydra.run.dir=")]
            how = (f"`grpo-ablate sweep --resume {run_dir.parent}` continues it" if in_sweep
                   else _how_to_continue(run_dir, overrides + given_dir[-1:]))
            Console(stderr=True).print(f"{prefix}interrupted: {stop.reason}; {how}", markup=False, highlight=False,
                                       soft_wrap=True)
        _last_exit_code = 128 + stop.signum
        stop.resend()
        return _last_exit_code
    except (ConfigError, ModelPathError) as err:
        Console(stderr=True).print(f"{prefix}error: {err}", markup=False, highlight=False, soft_wrap=True)
        remove_if_unused(run_dir)
        _last_exit_code = EXIT_BAD_INPUT
        return _last_exit_code
    except Exception:
        # the run dir keeps the whole story (status.json has the one-line reason)
        if os.environ.get("RANK", "0") == "0":
            (run_dir / "traceback.txt").write_text(traceback.format_exc())
        raise
    if os.environ.get("RANK", "0") != "0":   # torchrun: rank 0 reports for the run
        pass
    elif result.state == "completed" and result.base_accuracy is not None:
        console.print(f"{prefix}base eval {result.eval_label} {result.base_accuracy:.3f} -> final "
                      f"{result.final_accuracy:.3f}  ({run_dir})", markup=False, highlight=False)
    else:
        console.print(f"{prefix}{result.state} at step {result.step}  ({run_dir})", markup=False,
                      highlight=False)
    _last_exit_code = result.exit_code
    return _last_exit_code


def _how_to_continue(run_dir: Path, overrides: list[str]) -> str:
    """What continues an interrupted run: --resume from a checkpoint, --restart without one, or,
    stopped before the run started (e.g. during the warm start), the same command again."""
    if find_checkpoint(run_dir) is not None:
        return f"`grpo-ablate train --resume {run_dir}` continues it from its last checkpoint"
    if (run_dir / "status.json").exists():
        return f"it has no checkpoint yet: `grpo-ablate train --resume {run_dir} --restart` starts it over"
    remove_if_unused(run_dir)
    given = " ".join(_as_typed(o) for o in overrides if not o.startswith("hydra.") or o.startswith("hydra.run.dir="))
    return f"it had not started, nothing was kept: run `grpo-ablate train {given}` again".replace("  ", " ")


def _as_typed(override: str) -> str:
    """The run dir as a user types it in a shell (the CLI quotes it for Hydra itself): without
    Hydra's quotes, shell-quoted only where a character needs it."""
    if not override.startswith("hydra.run.dir="):
        return override
    return shlex.quote("hydra.run.dir=" + hydra_unquoted(override.split("=", 1)[1]))


def remove_if_unused(run_dir: Path) -> None:
    """Bad input found after Hydra made the dir: remove it if it holds only what Hydra wrote
    there (another process may hold it: then its lock is there too)."""
    hydra_only = {".hydra", "train.log"}
    if run_dir.exists() and all(p.name in hydra_only for p in run_dir.iterdir()):
        shutil.rmtree(run_dir, ignore_errors=True)


def run_hydra(args: list[str]) -> int:
    """Run the Hydra app with `args` as its command line; returns the exit code."""
    global _last_exit_code
    _last_exit_code = 0
    saved_argv = sys.argv
    args = listed_since(args)   # `+adv.lam_fn=vapo` recorded before adv=gae's config listed the key
    sys.argv = ["grpo-ablate train", *args]
    scratch = None
    if os.environ.get("RANK", "0") != "0":
        # torchrun: rank 0's Hydra makes and owns the run dir (the trainer tells the other ranks
        # where it is); the others write nothing: their Hydra output goes to a scratch dir.
        scratch = tempfile.mkdtemp(prefix="grpo-ablate-rank-")
        sys.argv = ["grpo-ablate train", *[a for a in args if not a.startswith("hydra.run.dir=")],
                    f"hydra.run.dir={scratch}", "hydra.output_subdir=null",
                    "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    try:
        hydra_train()
    finally:
        sys.argv = saved_argv
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return _last_exit_code


if __name__ == "__main__":
    hydra_train()
