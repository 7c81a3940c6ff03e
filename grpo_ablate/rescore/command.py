"""`grpo-ablate eval DIR [overrides]`: score a finished run, or every finished run of a sweep, under
an eval protocol (and, optionally, another task or eval file), from the weights the run kept.

    grpo-ablate eval runs/sweeps/loo                       eval=sampled: 8 samples per problem at T=1
    grpo-ablate eval runs/sweeps/loo eval.samples=16 --name k16
    grpo-ablate eval RUN task=jsonl task.path=bench.jsonl --name bench --steps all

Each run gets evals/<name>.json (the protocol, the task and its eval set: written first, atomically)
and evals/<name>.jsonl (one row per scored step, in evals.jsonl's format) beside its training files,
which it never touches. Steps: the start (0: the run's model before training) and the final
checkpoint; `--steps all` adds every eval step whose weights the run kept (eval.keep_weights).
A step already in the file is not scored again, so a stopped eval continues where it stopped; a
file of that name made under other settings is refused, never mixed. The draws are the run's eval
draws at that step (evals/score.py): a run that evaluated in training under the same protocol
gets the same numbers here. The report reads them with `grpo-ablate report DIR --eval <name>`.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError, DamagedFile
from grpo_ablate.evals.scores import read_row
from grpo_ablate.report.schema import foreign_problem
from grpo_ablate.rundir.files import (EVALS_DIR, WEIGHTS, atomic_write_text, find_checkpoint, read_json, read_jsonl,
                                      read_overrides, read_status)
from grpo_ablate.rundir.lock import DirLock
from grpo_ablate.config.spec import RunSpec, run_spec
from grpo_ablate.rundir.stopping import RunInterrupted, stop_on_signals
from grpo_ablate.sweep.manifest import read_manifest

DEFAULT_PROTOCOL = "sampled"        # what `grpo-ablate eval DIR` scores when no eval=<option> is given
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
STEPS = ("final", "all")


@dataclass(frozen=True)
class EvalRequest:
    """What `grpo-ablate eval` was asked: the run or sweep dir, the overrides of the protocol and the
    task, the results' name (None: the protocol's), which steps, torch threads."""
    dir: Path
    overrides: tuple[str, ...] = ()
    name: str | None = None
    steps: str = "final"
    threads: int | None = None


@dataclass
class Planned:
    """One run to score: its dir and label, its config with the protocol (and task) swapped in, its
    spec, the steps to score (0 = the start), where each step's weights are, and the header."""
    label: str
    run_dir: Path
    spec: RunSpec
    steps: list[int]
    weights: dict
    header: dict
    done: dict = field(default_factory=dict)   # step -> row already in the results file


# ------------------------------------------------------------------------------ planning (no torch)
def plan(req: EvalRequest, say) -> tuple[list[Planned], str]:
    """Every run to score, checked before any is scored; (the runs, the results' name). Bad input,
    a foreign run dir, or results of that name made another way: ConfigError in one line."""
    if req.steps not in STEPS:
        raise ConfigError(f"--steps {req.steps!r} is not allowed; allowed: final (the start and the final "
                          "checkpoint), all (and every eval step's kept weights)")
    check_overrides(req.overrides)
    runs = runs_of(Path(req.dir))
    planned, name = [], None
    for label, run_dir, entry, manifest in runs:
        status = _status(run_dir)
        if status is None or status["state"] != "completed":
            state = "not started" if status is None else f"{status['state']} at step {status['step']}"
            say(f"{label}: skipped, {state} (only a completed run's weights are scored)")
            continue
        config = _config(run_dir)
        if manifest is not None:
            foreign = foreign_problem(config, entry, manifest)
            if foreign is None and entry.get("config_hash") and status.get("config_hash") not in (None,
                                                                                              entry["config_hash"]):
                foreign = "it trained another config than the sweep planned"
            if foreign is not None:
                raise ConfigError(f"{run_dir} is not this sweep's run ({foreign}); move it out of {req.dir} or "
                                  "score it on its own")
        cfg = scored_config(run_dir, config, req.overrides)
        spec = run_spec(cfg)
        name = name or req.name or spec.eval.name
        if not NAME.fullmatch(name):
            raise ConfigError(f"--name {name!r} is not allowed; a file name of letters, digits, '_', '.', '-'")
        steps, weights = scored_steps(run_dir, status, req.steps)
        header = {"name": name, "protocol": spec.eval.settings(), "max_new_tokens": spec.schedule.eval_max_new_tokens,
                  "task": OmegaConf.to_container(spec.task, resolve=True)}
        done = existing_rows(run_dir, name, header)
        planned.append(Planned(label, run_dir, spec, steps, weights, header, done))
    if not planned:
        raise ConfigError(f"{req.dir}: no completed run to score")
    if req.steps == "all" and all(len(p.steps) <= 2 for p in planned):
        say("--steps all: no run kept its weights at the eval steps (train with eval.keep_weights=true): the start "
            "and the final checkpoint only")
    return planned, name


def check_overrides(overrides) -> None:
    """Only the protocol (`eval=...`, `eval.*`) and the task (`task=...`, `task.*`) may change: the
    weights scored are the run's."""
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if "=" not in override or key.split(".")[0] not in ("eval", "task") or override.startswith("~"):
            raise ConfigError(f"{override}: `grpo-ablate eval` takes overrides of the eval protocol (eval=<option>, "
                              "eval.samples=16, ...) and of the task (task=jsonl task.path=..., task.eval_size=...); "
                              "the run's weights and settings are what is scored")


def runs_of(directory: Path) -> list[tuple[str, Path, dict, dict | None]]:
    """(label, run dir, its manifest entry, the manifest) of a sweep dir's runs, or of one run dir."""
    if not directory.is_dir():
        raise ConfigError(f"{directory}: no such directory")
    manifest_path = directory / "manifest.json"
    if manifest_path.exists():
        manifest = read_manifest(directory)
        return [(entry["run_dir"], directory / entry["run_dir"], entry, manifest) for entry in manifest["runs"]]
    if (directory / "config.yaml").exists() and (directory / "overrides.yaml").exists():
        return [(directory.name, directory, {}, None)]
    raise ConfigError(f"{directory} is neither a run dir (config.yaml, overrides.yaml, status.json) nor a sweep dir "
                      "(manifest.json): nothing of grpo-ablate's to score")


def _status(run_dir: Path) -> dict | None:
    try:
        return read_status(run_dir)
    except DamagedFile as err:
        raise ConfigError(f"{err}; the run cannot be scored") from None


def _config(run_dir: Path) -> dict:
    path = run_dir / "config.yaml"
    try:
        config = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as err:   # noqa: BLE001 - unreadable YAML, a missing file: one line
        raise ConfigError(f"{path} cannot be read ({type(err).__name__}); the run cannot be scored") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a config; the run cannot be scored")
    return config


def scored_config(run_dir: Path, config: dict, overrides) -> object:
    """The run's config (config.yaml, as it ran) with the eval group composed from the overrides
    (eval=sampled unless one is given), and the task too where an override names it: composed with
    the run's own overrides under them, so `task.eval_size=1000` keeps the run's task.level."""
    try:
        own = [o for o in (read_overrides(run_dir) or []) if not o.startswith(("hydra.", "resume="))]
    except DamagedFile as err:
        raise ConfigError(f"{err}; the run cannot be scored") from None
    given = list(overrides)
    if not any(o.split("=", 1)[0] == "eval" for o in given):
        given.insert(0, f"eval={DEFAULT_PROTOCOL}")
    composed = compose([o for o in own if o.split("=", 1)[0] != "eval" and not o.startswith("eval.")] + given)
    cfg = OmegaConf.create(config)
    cfg.eval = composed.eval
    if any(o.lstrip("+").split("=", 1)[0].split(".")[0] == "task" for o in given):
        cfg.task = composed.task
    OmegaConf.set_struct(cfg, True)
    validate(cfg)
    return cfg


def scored_steps(run_dir: Path, status: dict, which: str) -> tuple[list[int], dict]:
    """The steps to score and where each step's weights are (None: the run's start, its model source)."""
    final = int(status["step"])
    checkpoint = find_checkpoint(run_dir)
    if checkpoint is None:
        raise ConfigError(f"{run_dir} has no checkpoint (checkpoint/): its final weights are gone; it cannot be scored")
    weights = {0: None, final: checkpoint}
    if which == "all":
        for kept in sorted((run_dir / WEIGHTS).glob("step-*")):
            step = kept.name[len("step-"):]
            if step.isdigit() and 0 < int(step) < final and (kept / "config.json").exists():
                weights[int(step)] = kept
    return sorted(weights), weights


def results_paths(run_dir: Path, name: str) -> tuple[Path, Path]:
    """evals/<name>.json (the header) and evals/<name>.jsonl (the rows) of a run dir."""
    return run_dir / EVALS_DIR / f"{name}.json", run_dir / EVALS_DIR / f"{name}.jsonl"


def existing_rows(run_dir: Path, name: str, header: dict) -> dict:
    """step -> row of results already there under `header`; results of that name made another way are
    refused (another protocol, max_new_tokens or task: their numbers are not these)."""
    head_path, rows_path = results_paths(run_dir, name)
    if not head_path.exists():
        return {}
    try:
        existing = read_json(head_path, "results header")
    except DamagedFile:
        return {}   # a header cut off mid-write: written again, and the rows scored afresh
    if not isinstance(existing, dict):
        return {}
    for key in ("protocol", "max_new_tokens", "task"):
        if existing.get(key) != header[key]:
            raise ConfigError(f"{head_path} holds results of another {key.replace('_', ' ')} "
                              f"({_short(existing.get(key))}, not {_short(header[key])}); give these another "
                              f"--name, or remove {head_path.parent / name}.* to score them again")
    rows, _ = read_jsonl(rows_path)
    return {r["step"]: r for r in rows if isinstance(r.get("step"), int)}


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


# ------------------------------------------------------------------------------ scoring
def run(req: EvalRequest, console) -> int:
    """Plan, then score every run (the training stack is imported here); one line per run."""
    say = lambda text: console.print(text, markup=False, highlight=False)
    planned, name = plan(req, say)
    from grpo_ablate.rescore.weights import Scorer  # torch and transformers: once the input is good

    scorer = Scorer(req.threads)
    todo = sum(len(p.steps) - len(set(p.steps) & set(p.done)) for p in planned)
    say(f"eval {name}: {planned[0].spec.eval.describe()}, {len(planned)} run(s), {todo} step(s) to score")
    try:
        with stop_on_signals():
            for i, p in enumerate(planned, 1):
                started = time.perf_counter()
                rows = score_run(p, name, scorer)
                say(f"[{i}/{len(planned)}] {p.label}: {progress(rows, p)}  ({time.perf_counter() - started:.1f} s)")
    except RunInterrupted as stop:
        say(f"interrupted: {stop.reason}; the steps scored so far are kept: run the same command again to continue")
        return 128 + stop.signum
    say(f"wrote {EVALS_DIR}/{name}.jsonl in {len(planned)} run dir(s); `grpo-ablate report {req.dir} --eval {name}` "
        "reads them")
    return 0


def score_run(p: Planned, name: str, scorer) -> dict:
    """Score the planned steps of one run that its results file lacks, appending a row each."""
    head_path, rows_path = results_paths(p.run_dir, name)
    with DirLock(p.run_dir, "run dir"):
        head_path.parent.mkdir(exist_ok=True)
        atomic_write_text(head_path, json.dumps(p.header, indent=2, sort_keys=True) + "\n")
        kept = {s: r for s, r in p.done.items() if s in p.steps}
        # whole rows only: a row cut off by a stop is dropped, the step scored again
        atomic_write_text(rows_path, "".join(json.dumps(kept[s]) + "\n" for s in sorted(kept)))
        for step in p.steps:
            if step in kept:
                continue
            row = scorer.score(p.spec, p.run_dir, step, p.weights[step])
            with open(rows_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            kept[step] = row
    return kept


def progress(rows: dict, p: Planned) -> str:
    """'step 0 avg@8 0.692 pass@8 0.894 -> step 30 avg@8 0.734 pass@8 0.918'."""
    protocol = p.spec.eval
    shown = []
    for step in (min(rows), max(rows)) if rows else ():
        values = read_row(rows[step]).summaries(protocol)
        top = max(protocol.pass_k or (), default=None)
        parts = [f"avg@{protocol.samples} {values['eval/accuracy']:.3f}"]
        if top is not None:
            parts.append(f"pass@{top} {values[f'eval/pass@{top}']:.3f}")
        shown.append(f"step {step} " + " ".join(parts))
    return " -> ".join(dict.fromkeys(shown))
