"""Everything a run writes: the run dir contract, checkpoints, and W&B.

Run dir (reports and resume depend on it):
    config.yaml      resolved config                      (atomic)
    overrides.yaml   the command-line overrides            (atomic)
    metrics.jsonl    one flat JSON object per step; `metrics.jsonl` is the source of truth
    samples.jsonl    a few completions every `samples_every` steps
    status.json      running | completed | diverged | failed, step, reason, wall time (atomic)
    checkpoint/      latest weights + optimizer + RNG state, replaced atomically
Every write that a resume depends on goes to a temporary file first and is renamed into place.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

TIMING_PREFIXES = ("time/", "perf/")  # the only fields that may differ between identical runs


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _finite_or_none(value):
    """Strict JSON: NaN/Inf are written as null (the step that produced them is flagged)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file; a torn last line (a kill mid-write) is ignored."""
    rows = []
    if Path(path).exists():
        for line in Path(path).read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return rows


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep rows with step <= last_step (what the checkpoint covers), atomically."""
    rows = [r for r in read_jsonl(path) if r.get("step", 0) <= last_step]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def read_status(run_dir: Path) -> dict | None:
    path = Path(run_dir) / "status.json"
    return json.loads(path.read_text()) if path.exists() else None


class RunLog:
    """Appends metrics and samples, keeps status.json current, mirrors metrics to W&B."""

    def __init__(self, run_dir: Path, cfg: DictConfig, overrides: list[str], config_hash: str,
                 resume_step: int | None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.config_hash = config_hash
        self.started = time.time()
        previous = read_status(self.run_dir) or {}
        self.wall_before = float(previous.get("wall_time_s", 0.0)) if resume_step is not None else 0.0
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.samples_path = self.run_dir / "samples.jsonl"
        if resume_step is None:  # a fresh start (also a resume killed before its first checkpoint)
            for path in (self.metrics_path, self.samples_path):
                path.unlink(missing_ok=True)
        else:
            truncate_jsonl(self.metrics_path, resume_step)
            truncate_jsonl(self.samples_path, resume_step)
        atomic_write_text(self.run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        atomic_write_text(self.run_dir / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(list(overrides))))
        self.wandb = WandbSink(cfg, self.run_dir, previous.get("wandb_id"))
        self.status("running", resume_step or 0)

    def status(self, state: str, step: int, reason: str | None = None) -> None:
        data = {"state": state, "step": step, "reason": reason,
                "wall_time_s": round(self.wall_before + time.time() - self.started, 2),
                "config_hash": self.config_hash, "wandb_id": self.wandb.run_id,
                "pid": os.getpid(), "host": socket.gethostname(),   # who writes this run (resume checks)
                "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        atomic_write_text(self.run_dir / "status.json", json.dumps(data, indent=2) + "\n")

    def log(self, metrics: dict) -> None:
        row = {k: _finite_or_none(v) for k, v in metrics.items()}
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

        mode = cfg.logger.mode
        if mode == "auto":
            mode = os.environ.get("WANDB_MODE") or ("online" if wandb_api_key() else "offline")
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


def wandb_api_key() -> str | None:
    """An API key from the environment or ~/.netrc, without touching the network."""
    if os.environ.get("WANDB_API_KEY"):
        return os.environ["WANDB_API_KEY"]
    try:
        import netrc

        auth = netrc.netrc().authenticators("api.wandb.ai")
        return auth[2] if auth else None
    except (OSError, netrc.NetrcParseError):
        return None


# --------------------------------------------------------------------------- checkpoints
def save_checkpoint(run_dir: Path, model, tokenizer, trainer_state: dict) -> None:
    """Write checkpoint.tmp/, then swap it in: checkpoint/ is always a complete checkpoint
    (during the swap, checkpoint.old/ is; `find_checkpoint` falls back to it)."""
    run_dir = Path(run_dir)
    tmp, final, old = run_dir / "checkpoint.tmp", run_dir / "checkpoint", run_dir / "checkpoint.old"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)  # loadable with from_pretrained, like any HF checkpoint
    tokenizer.save_pretrained(tmp)
    import torch   # here, not at the top: the report reads run dirs without torch

    torch.save(trainer_state, tmp / "trainer_state.pt")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(run_dir: Path) -> Path | None:
    for name in ("checkpoint", "checkpoint.old"):
        path = Path(run_dir) / name
        if (path / "trainer_state.pt").exists():
            return path
    return None
