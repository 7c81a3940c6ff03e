"""The sweep dir and its manifest: create, read, validate, write (atomically), refresh statuses.

A sweep dir holds `manifest.json` (the matrix and every run's variant, seed, config hash, run
dir and status; rewritten atomically) and one ordinary run dir per (variant, seed). A run's
status in the manifest is refreshed from its run dir (the truth), or from how its job ended
when the run never wrote one. A damaged manifest is one line naming the file.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from grpo_ablate.errors import DamagedFile
from grpo_ablate.report.schema import manifest_problem
from grpo_ablate.rundir.files import atomic_write_text, read_json, read_rows, read_status
from grpo_ablate.rundir.paths import confined_dir, writable_problem
from grpo_ablate.rundir.stopping import INTERRUPTED
from grpo_ablate.sweep.matrix import SweepError


MANIFEST = "manifest.json"
FINISHED = ("completed", "diverged")      # a divergence is a result, not a failure
# what every run of a manifest holds (what resume and the looks read), by type
_MANIFEST_RUN = {"run_dir": str, "variant": str, "seed": int, "overrides": list, "config_hash": str, "status": str}


def read_manifest(sweep_dir: Path) -> dict:
    """manifest.json, checked for what resume reads; damage is one line naming the file."""
    path = Path(sweep_dir) / MANIFEST
    if not path.exists():
        raise SweepError(f"{sweep_dir} is not a sweep dir (no {MANIFEST} there)")
    try:
        manifest = read_json(path, "manifest")
    except DamagedFile as err:
        raise SweepError(f"{err}; the sweep cannot be resumed from it: restore it or start a new sweep "
                         "(its finished run dirs can still be reported on)") from None
    problem = _manifest_problem(manifest)
    if problem:
        raise SweepError(f"{path} is damaged ({problem}); the sweep cannot be resumed from it: restore it or "
                         "start a new sweep (its finished run dirs can still be reported on)")
    return manifest


def _manifest_problem(manifest) -> str | None:
    """The report's schema of a manifest (report/schema.py: each field's type, declared once),
    then what resume needs besides: the fields it reads present, run dirs its own names."""
    problem = manifest_problem(manifest)
    if problem:
        return problem
    for key, kind in (("runs", list), ("variants", list), ("seeds", list), ("overrides", list)):
        if not isinstance(manifest.get(key), kind):
            return f"no list of {key}"
    if not manifest["runs"]:
        return "no runs"
    if not isinstance(manifest.get("name"), str):
        return "no sweep name"
    if not all(isinstance(v, dict) and isinstance(v.get("name"), str) for v in manifest["variants"]):
        return "a variant without a name"
    variants = {v["name"] for v in manifest["variants"]}
    for i, run in enumerate(manifest["runs"]):
        if not isinstance(run, dict):
            return f"run {i + 1} is not an object"
        missing = [key for key, kind in _MANIFEST_RUN.items() if not isinstance(run.get(key), kind)]
        if missing:
            return f"run {run.get('run_dir', i + 1)} has no valid {', '.join(missing)}"
        if run["run_dir"] in ("", ".", "..") or Path(run["run_dir"]).name != run["run_dir"]:
            return f"run dir {run['run_dir']!r} is not a name inside the sweep dir"
        if run["variant"] not in variants:
            return f"run {run['run_dir']} is of variant {run['variant']}, which the manifest does not list"
        recorded = sweep_id_of(run["overrides"])
        if recorded is not None and recorded != manifest.get("sweep_id"):
            return f"run {run['run_dir']} is of sweep {recorded}, not this sweep's {manifest.get('sweep_id')}"
    return None


def sweep_id_of(overrides: list) -> str | None:
    """The sweep a run was launched by, from its overrides (`sweep.id=...`, expand_jobs' label)."""
    ids = [o.split("=", 1)[1] for o in overrides if isinstance(o, str) and o.startswith("sweep.id=")]
    return ids[-1] if ids else None


def write_manifest(sweep_dir: Path, manifest: dict) -> None:
    manifest["updated_at"] = timestamp()
    atomic_write_text(Path(sweep_dir) / MANIFEST, json.dumps(manifest, indent=2) + "\n")


def timestamp() -> str:
    """Local time as the manifests record it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


OFF_PLAN = ("it trained another config than the one this sweep planned (conf/ or the code changed while the sweep "
            "ran); once they are as planned again: grpo-ablate sweep --resume {sweep_dir} --rerun {run_dir}")


def off_plan(run: dict, status: dict) -> bool:
    """A run dir whose config hash is not the one the manifest planned for it (a deferred run has
    none yet): its job composed the live conf/ when it started, and that had changed."""
    planned, trained = run.get("config_hash"), status.get("config_hash")
    return isinstance(planned, str) and isinstance(trained, str) and bool(planned) and planned != trained


def refresh_statuses(sweep_dir: Path, manifest: dict, outcomes: dict | None = None) -> None:
    """Each run's status from its run dir (the truth), or from how its job ended when the run
    never got as far as writing one (e.g. a crash while loading)."""

    for run in manifest["runs"]:
        run_dir = Path(sweep_dir) / run["run_dir"]
        status = read_status(run_dir) if run_dir.exists() else None
        outcome = (outcomes or {}).get(run["run_dir"])
        if status is not None:
            run.update(status=status["state"], step=status["step"], reason=status.get("reason"))
            if off_plan(run, status):   # conf/ or the code changed while the sweep ran: not this sweep's run
                run.update(status="failed", reason=OFF_PLAN.format(sweep_dir=sweep_dir, run_dir=run["run_dir"]))
        if outcome is not None and (status is None or status["state"] not in FINISHED + ("failed", INTERRUPTED)):
            # the job ended without the run recording an end of its own
            run.update(status="failed", reason=outcome.get("error") or f"exit code {outcome.get('exit_code')}")
        accuracies = [r["eval/accuracy"] for r in read_rows(run_dir / "metrics.jsonl")
                      if r.get("eval/accuracy") is not None]
        run["final_accuracy"] = accuracies[-1] if accuracies and run["status"] == "completed" else None


def create_sweep_dir(req, manifest: dict) -> Path:
    """The sweep dir of `req` (a SweepRequest: --dir, else a new one under runs/sweeps/) with
    its manifest; never an existing non-empty one."""
    sweep_dir = planned_sweep_dir(req, manifest)
    check_new_dir(sweep_dir)
    problem = writable_problem(sweep_dir)
    if problem:
        raise SweepError(f"cannot write the sweep dir {sweep_dir}: {problem}; give --dir <a writable path>"
                         + ("" if req.sweep_dir else " or run from a writable directory"))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(sweep_dir, manifest)
    return sweep_dir


def check_new_dir(sweep_dir: Path) -> None:
    if sweep_dir.is_dir() and any(sweep_dir.iterdir()):
        raise SweepError(f"{sweep_dir} already exists and is not empty; continue it with "
                         f"`grpo-ablate sweep --resume {sweep_dir}` or pick another --dir")


def planned_sweep_dir(req, manifest: dict) -> Path:
    """Where the sweep of `req` is written, checked before anything is created: --dir (anywhere
    but the working directory or above it), else a new dir under runs/sweeps/; every run dir a
    name inside it (rundir.confined_dir: no escape, no name too long for the file system)."""
    if req.sweep_dir is not None:
        sweep_dir = confined_dir(req.sweep_dir, "--dir")
    else:
        sweep_dir = confined_dir(_new_sweep_dir(manifest), "sweep dir", SWEEPS)
    for run in manifest["runs"]:
        confined_dir(sweep_dir / run["run_dir"], "run dir", sweep_dir)
    return sweep_dir


SWEEPS = Path("runs") / "sweeps"   # where a sweep without --dir goes, from the working directory


def _new_sweep_dir(manifest: dict) -> Path:
    path = SWEEPS / manifest["wandb_group"]
    suffix = 1
    while path.exists():
        suffix += 1
        path = SWEEPS / f"{manifest['wandb_group']}-{suffix}"
    return path
