"""What a run dir allows: start, continue from a checkpoint, start over, or nothing (finished).

Torch-free, so `grpo-ablate train --resume DIR` applies these rules, and refuses, before the
training stack is imported; the trainers (train/grpo.py, train/controls.py) apply the same ones.
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from grpo_ablate.config.identity import config_hash
from grpo_ablate.errors import ConfigError, DamagedFile
from grpo_ablate.rundir.files import checkpoint_problem, find_checkpoint, read_status, recorded_config

SPLIT_KEYS = ("micro_batch_size", "max_tokens_per_forward")   # updates.*: how a step is summed, not what


def open_run_dir(cfg: DictConfig, run_dir: Path, restart_without_checkpoint: bool = True
                 ) -> tuple[dict | None, Path | None]:
    """The run dir's status and the checkpoint to continue from (with resume=true), or
    ConfigError saying why the run dir cannot be used and what to do. A dir that holds a run is
    only continued, only with the config it was started with, and only from a whole checkpoint;
    a finished result is never restarted. `resume=restart` starts an unfinished run over (its
    metrics are replaced); `restart_without_checkpoint`: a run that stopped before its first
    checkpoint starts over by itself (a sweep's resume; `train --resume` asks for --restart)."""
    restart = str(cfg.resume) == "restart"
    again = f"start it over with `grpo-ablate train --resume {run_dir} --restart`"
    try:
        status = read_status(run_dir)
    except DamagedFile as err:
        if restart:
            return None, None
        raise ConfigError(f"run dir {run_dir}: {err.path.name} {err.problem}; {again}") from None
    if status is not None and not cfg.resume:
        raise ConfigError(f"run dir {run_dir} already holds a run ({status['state']}); "
                          f"continue it with `grpo-ablate train --resume {run_dir}` or pick a new dir")
    if status is None or not cfg.resume:
        return status, None
    if status.get("config_hash") != config_hash(cfg):
        raise ConfigError(f"cannot resume {run_dir}: the config differs from the one it was started "
                          "with (only steps, logger, run labels, threads and the micro-batch split may change)")
    finished = status["state"] in ("completed", "diverged")
    if restart and finished:
        raise ConfigError(f"run dir {run_dir} is {status['state']} at step {status['step']}: a finished result is "
                          "never restarted; start a new run (another hydra.run.dir)")
    checkpoint = None if restart else find_checkpoint(run_dir)
    problem = checkpoint_problem(checkpoint) if checkpoint is not None else None
    if problem:
        raise ConfigError(f"run dir {run_dir}: {checkpoint.name}/ {problem}; "
                          + ("it finished, so there is nothing to continue: start a new run for more steps"
                             if finished else again))
    if already_finished(status, cfg) or checkpoint is not None or restart:
        return status, checkpoint
    if finished:
        raise ConfigError(f"run dir {run_dir} is {status['state']} at step {status['step']} and has no checkpoint "
                          f"to continue to steps={cfg.steps} from; a finished result is never restarted: start a "
                          "new run for more steps")
    if status["step"] > 0 and not restart_without_checkpoint:
        raise ConfigError(f"run dir {run_dir} stopped at step {status['step']} ({status['state']}) before its first "
                          f"checkpoint, so it cannot be continued; {again}")
    return status, None


def split_changed(cfg: DictConfig, run_dir: Path) -> str | None:
    """The line a resume with another micro-batch split gets (None: the same split). The split is allowed to
    change (a run that ran out of memory resumes split) and changes what a step computes only by the order in
    which its gradient is summed: in float64 the two agree to 1e-10 (tests/test_micro_batches.py), in float32
    to about 1e-7 per step, and a sampled token can flip on such a difference, so from there on the run is
    the same experiment, not the continuation bit for bit that a resume with the same split is."""
    before = recorded_config(run_dir).get("updates") or {}
    written = lambda value: "null" if value is None else value   # as the config says it
    changed = [f"updates.{key}={written(cfg.updates.get(key))} (was {written(before.get(key))})" for key in SPLIT_KEYS
               if isinstance(before, dict) and before.get(key) != cfg.updates.get(key)]
    if not changed:
        return None
    return (f"resuming with {', '.join(changed)}: the split sums each step's gradient in another order, so the "
            "numbers from here differ from the unsplit run's in the last bits (float32: about 1e-7 a step, and "
            "a sampled token can flip on it); the same experiment, not a bit-for-bit continuation")


def already_finished(status: dict | None, cfg: DictConfig) -> bool:
    """A finished result is never redone: completed at (or past) the asked-for steps, or diverged."""
    return status is not None and (status["state"] == "diverged"
                                   or status["state"] == "completed" and status["step"] >= cfg.steps)


def threads_to_run(threads: int | None, status: dict | None, checkpoint: Path | None) -> int | None:
    """The torch threads of a run: `threads` where it is set; a run continued from its checkpoint with
    `threads: null` takes the count it recorded (status.json's `threads`, which the cores that were free
    decided), so it goes on as it would have; else None (the cores free now: rundir/cores.py)."""
    recorded = (status or {}).get("threads") if checkpoint is not None else None
    return threads or (recorded if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded > 0
                       else None)


def check_same_start(status: dict | None, start: dict | None, run_dir: Path) -> None:
    """A run continues from the start it began with: where its resume loads the start again (a LoRA
    run's base, the reference policy of a KL term), the weights are the ones status.json recorded
    (`start`), else ConfigError before anything is written. A run dir from before the record, or a
    resume that loads its checkpoint alone, is not checked."""
    recorded = (status or {}).get("start")
    if not isinstance(recorded, dict) or start is None or recorded.get("weights") == start["weights"]:
        return
    raise ConfigError(f"cannot resume {run_dir}: it started from the weights {recorded.get('weights')} of "
                      f"{recorded.get('model')}, and {start['model']} here holds the weights {start['weights']} "
                      "(another machine's warm start, or the model changed); resume it where its start is, or "
                      "share the model cache between machines (docs/slurm.md)")
