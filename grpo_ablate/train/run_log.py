"""What a training run writes into its run dir (the contract is in `grpo_ablate/rundir/files.py`):
metrics, samples and status as it goes, checkpoints, and the W&B mirror of its metrics."""
from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from grpo_ablate.errors import DamagedFile
from grpo_ablate.config.spec import RunRecord
from grpo_ablate.rundir.files import (CHECKPOINT, CHECKPOINT_OLD, CHECKPOINT_TMP, EVAL_SCORES, EVALS, WEIGHTS,
                                      atomic_write_text, finite_or_none, read_status, truncate_jsonl)
from grpo_ablate.wandb_auth import resolve_mode


class RunLog:
    """Appends metrics and samples, keeps status.json current, mirrors metrics to W&B. The one
    writer of the composed config (`record.config`: config.yaml, W&B's config)."""

    def __init__(self, run_dir: Path, record: RunRecord, overrides: list[str], resume_step: int | None,
                 started_from: dict | None = None, threads: int | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config_hash, self.threads = record.config_hash, threads
        self.started = time.time()
        try:
            previous = read_status(self.run_dir) or {}
        except DamagedFile:   # `--restart` of a run whose status.json is damaged: written anew below
            if resume_step is not None:
                raise
            previous = {}
        self.wall_before = float(previous.get("wall_time_s", 0.0)) if resume_step is not None else 0.0
        # what the run started from is its first start's (a run dir from before the record has none)
        self.started_from = started_from if resume_step is None else previous.get("start")
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.samples_path = self.run_dir / "samples.jsonl"
        self.evals_path = self.run_dir / EVALS
        if resume_step is None:  # a fresh start (also a resume killed before its first checkpoint, or --restart)
            for path in (self.metrics_path, self.samples_path, self.evals_path):
                path.unlink(missing_ok=True)
            for name in (CHECKPOINT, CHECKPOINT_OLD, CHECKPOINT_TMP, WEIGHTS):   # another history's: never resumed
                shutil.rmtree(self.run_dir / name, ignore_errors=True)                    # from, never scored
        else:
            truncate_jsonl(self.metrics_path, resume_step)
            truncate_jsonl(self.samples_path, resume_step)
            truncate_jsonl(self.evals_path, resume_step)
        atomic_write_text(self.run_dir / "config.yaml", OmegaConf.to_yaml(record.config, resolve=True))
        atomic_write_text(self.run_dir / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(list(overrides))))
        self.wandb = WandbSink(record.config, self.run_dir, previous.get("wandb_id"))
        self.status("running", resume_step or 0)

    def status(self, state: str, step: int, reason: str | None = None) -> None:
        data = {"state": state, "step": step, "reason": reason,
                "wall_time_s": round(self.wall_before + time.time() - self.started, 2),
                "config_hash": self.config_hash, "wandb_id": self.wandb.run_id,
                "start": self.started_from, "threads": self.threads,   # beside the hash: both may differ by machine
                "pid": os.getpid(), "host": socket.gethostname(),   # who writes this run (resume checks)
                "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        atomic_write_text(self.run_dir / "status.json", json.dumps(data, indent=2) + "\n")

    def log(self, metrics: dict) -> None:
        """One step's metrics; an eval's per-problem scores (under EVAL_SCORES) go to evals.jsonl."""
        metrics = dict(metrics)
        scores = metrics.pop(EVAL_SCORES, None)   # evals/scores.ProblemScores
        if scores is not None:
            with open(self.evals_path, "a") as f:
                f.write(json.dumps(scores.row(metrics["step"])) + "\n")
        row = {k: finite_or_none(v) for k, v in metrics.items()}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(row) + "\n")
        self.wandb.log(metrics)

    def samples(self, step: int, rows: list[dict]) -> None:
        with open(self.samples_path, "a") as f:
            for row in rows:
                f.write(json.dumps({"step": step, **row}) + "\n")

    def close(self) -> None:
        self.wandb.finish()


class WandbSink:
    """W&B run mirroring metrics.jsonl; offline by itself when no API key is configured."""

    def __init__(self, cfg: DictConfig, run_dir: Path, resume_id: str | None):
        self.run, self.run_id = None, resume_id
        if cfg.logger.name != "wandb" or cfg.logger.mode == "disabled":
            return
        import wandb

        mode = resolve_mode(cfg.logger.mode)
        self.run = wandb.init(
            project=cfg.logger.project, entity=cfg.logger.entity, dir=str(run_dir), mode=mode,
            name=cfg.run.name or run_dir.name, group=cfg.run.group, job_type=cfg.run.job_type,
            tags=list(cfg.run.tags), config=wandb_config(cfg),
            id=resume_id, resume="allow" if resume_id else None,
            settings=wandb.Settings(x_disable_stats=True, console="off", silent=True),
        )
        self.run_id = self.run.id

    def log(self, metrics: dict) -> None:
        if self.run is not None:
            self.run.log({k: v for k, v in metrics.items() if k != "step"}, step=int(metrics["step"]))

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def wandb_config(cfg: DictConfig) -> dict:
    """The run config for W&B. In a sweep, `tricks` becomes one true/false flag per trick of the
    sweep (what W&B's grouping, parallel-coordinates and run-comparer panels filter on); the
    named tricks' descriptions move to `trick_info`."""
    config = OmegaConf.to_container(cfg, resolve=True)
    sweep_tricks = list(cfg.get("sweep", {}).get("tricks") or [])
    if sweep_tricks:
        config["trick_info"] = config.pop("tricks", {})
        config["tricks"] = {name: name in config["trick_info"] for name in sweep_tricks}
    return config


# --------------------------------------------------------------------------- checkpoints
def save_weights(run_dir: Path, step: int, model, tokenizer, weights: dict | None = None) -> None:
    """eval.keep_weights: the policy at an eval step, as weights/step-<step>/ (loadable with
    from_pretrained, as a checkpoint; written to a temporary dir and renamed into place, so a
    weights dir that exists is whole). What `grpo-ablate eval --steps all` scores."""
    final = Path(run_dir) / WEIGHTS / f"step-{step}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, state_dict=weights)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(final, ignore_errors=True)   # a resumed run writes its step again: the same weights
    os.rename(tmp, final)


def save_checkpoint(run_dir: Path, model, tokenizer, trainer_state: dict, weights: dict | None = None) -> None:
    """Write checkpoint.tmp/, then swap it in: checkpoint/ is always a complete checkpoint
    (during the swap, checkpoint.old/ is; `find_checkpoint` falls back to it). `weights`: the
    model's full state dict when its own is sharded (model.fsdp=true)."""
    run_dir = Path(run_dir)
    tmp, final, old = run_dir / CHECKPOINT_TMP, run_dir / CHECKPOINT, run_dir / CHECKPOINT_OLD
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, state_dict=weights)  # loadable with from_pretrained, like any HF checkpoint
    tokenizer.save_pretrained(tmp)
    torch.save(trainer_state, tmp / "trainer_state.pt")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
