"""`grpo-ablate sweep`: plan the runs, validate every one, launch them through Hydra, record.

A sweep dir holds `manifest.json` (the matrix and every run's variant, seed, config hash,
run dir and status; rewritten atomically) and one ordinary run dir per (variant, seed).
Everything is checked before the dir is created, so bad input leaves nothing behind.
The runs go through Hydra's launcher plugins via the thin sweeper in `hydra_plugins/`;
`resume` re-launches only what is unfinished and never rewrites a finished run.
"""
from __future__ import annotations

import copy
import importlib.util
import json
import math
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from omegaconf import OmegaConf

from grpo_ablate.catalogue import load_catalogue
from grpo_ablate.config import ConfigError, compose, config_hash, family_keys, trick_families, validate
from grpo_ablate.inert import inert_reason
from grpo_ablate.model_source import gguf_source, warm_start_dir
from grpo_ablate.errors import DamagedFile
from grpo_ablate.rundir import DirLock, atomic_write_text, read_json, read_rows, read_status, writable_problem
from grpo_ablate.stopping import INTERRUPTED
from grpo_ablate.sweep.controls import control_kinds, planned_controls, with_controls
from grpo_ablate.sweep.matrix import (DEFAULT_MAX_RUNS, Context, Matrix, SweepError, build_matrix, check_contexts,
                                      check_size, expand_jobs, parse_seeds, with_contexts)
from grpo_ablate.sweep.slurm import watch_jobs_without_sacct
from grpo_ablate.tasks import TASKS, build_task


MANIFEST = "manifest.json"
FINISHED = ("completed", "diverged")      # a divergence is a result, not a failure
# --launcher -> (the Hydra launcher config, the plugin module that provides it, the extra)
LAUNCHERS = {
    "basic": ("basic", None, None),
    "joblib": ("joblib", "hydra_plugins.hydra_joblib_launcher", "grpo-ablate"),
    "submitit_local": ("submitit_local", "hydra_plugins.hydra_submitit_launcher", "grpo-ablate"),
    "submitit_slurm": ("submitit_slurm", "hydra_plugins.hydra_submitit_launcher", "grpo-ablate"),
    "ray": ("ray", "hydra_plugins.hydra_ray_launcher", "grpo-ablate[ray]"),
}
# What `grpo-ablate sweep leave-one-out` runs with no options: the seed review's recommended
# tricks on vanilla GRPO, plus DAPO's dynamic sampling (on the embedded task most groups are
# all-correct or all-wrong, so which groups a step trains on is part of the default question)
# and Dr. GRPO's advantages without the group std (a disputed choice: GRPO divides by it,
# Dr. GRPO drops it against a difficulty bias, Tricks or Traps finds dropping it steadier on
# easy data), on the embedded default, five seeds; measured in docs/calibration.md.
DEFAULT_TRICKS = ["kl_adaptive", "length_group", "entropy_adaptive", "learnable_temperature", "dynamic_sampling",
                  "no_std"]
DEFAULT_BASE = "grpo"
# Five, not three: paired over 3 seeds, a 95% interval excludes zero only for an effect above
# ~2.5 of its paired SDs (t = 4.30 at 2 df; at 5 seeds, t = 2.78 and ~1.2 SDs), and on the
# embedded default the paired SD of a trick's effect is 0.04-0.09 accuracy: at three seeds
# this question decides none of its six tricks, at five two (docs/calibration.md). --seeds
# auto spends seeds only where a contrast is still open.
DEFAULT_SEEDS = "5"
# keys a sweep sets itself; the user chooses them through the sweep's own options
_RESERVED = {"seed": "--seeds", "trick": "--tricks", "+trick": "--tricks", "preset": "--base",
             "resume": "--resume", "control": "--controls"}


@dataclass
class SweepRequest:
    mode: str
    tricks: list[str] = field(default_factory=list)
    base: str | None = None
    seeds: str | int | list = DEFAULT_SEEDS
    overrides: list[str] = field(default_factory=list)    # train overrides common to every run
    hydra_args: list[str] = field(default_factory=list)   # hydra.* overrides (launcher settings)
    launcher: str = "joblib"
    jobs: int | None = None
    max_runs: int = DEFAULT_MAX_RUNS
    axes: list[tuple[str, list]] = field(default_factory=list)
    name: str | None = None
    steps: int | None = None
    sweep_dir: Path | None = None
    controls: bool | None = None     # None: on for the embedded default, off for model.path models
    control_budget: str = "tokens"   # the SFT control's budget: tokens | wall (the treatments' time)
    allow_inert: bool = False        # run tricks under test that cannot act here (inert.py) anyway
    matrix: Matrix | None = None        # a matrix built by the caller (doctor) instead of `mode`
    group: str | None = None            # W&B group shared with other sweeps (doctor's stages)
    sequential: dict = field(default_factory=dict)   # seeds=auto: max_seeds, budget, effect (sweep/sequential.py)
    contexts: list[Context] = field(default_factory=list)   # --across / a file's contexts: the matrix in each
    summary: str | None = None       # what the sweep decides on (report/curves.py label), fixed before any run


# ------------------------------------------------------------------------------ planning
# What a sweep decides on unless told: the mean of the last three evals (issue 31: on the default sweep
# it halves the paired SD of the final eval, which a peaking-then-drifting curve makes noisy; README,
# "Calibration"). Fixed in the manifest before the first run.
DECISION_METRIC, DECISION_SUMMARY = "eval/accuracy", "last_3"


def plan(req: SweepRequest) -> dict:
    """The manifest of a new sweep (statuses pending), fully validated; writes nothing."""
    families = {row["name"]: row["family"] for row in load_catalogue()}
    options = {row["name"]: row["option"] for row in load_catalogue()}
    _check_overrides(req.overrides)
    matrix = req.matrix or build_matrix(req.mode, req.tricks, families, req.axes, options=options)
    seeds = parse_seeds(req.seeds)
    common = ([f"preset={req.base}"] if req.base else []) + list(req.overrides)
    if req.steps is not None:
        common.append(f"steps={req.steps}")
    if req.contexts:
        check_contexts(req.contexts, matrix, families, common)
        for context in req.contexts:   # a bad value is named by its context, before any run is composed
            _compose(common + list(context.overrides), f"context {context.name}")
    common, matrix = scope_trick_settings(common, matrix)   # no context may set a trick's family
    base_cfg = _compose(common, "the base")
    matrix = plan_controls(req, matrix, common, base_cfg)   # before the contexts: each context gets its own
    if req.contexts:   # the matrix repeated in every context
        matrix = with_contexts(matrix, req.contexts)
    check_size(matrix, seeds, req.max_runs)
    for trick in req.tricks:   # dropping a trick the base already has would change nothing
        family = families[trick]
        if base_cfg[family].name == options[trick]:
            where = 'preset=' + req.base if req.base else 'the defaults'
            raise SweepError(f"trick {trick} is already on in the base ({where} "
                             f"sets {family}={options[trick]}), so switching it off would change nothing; "
                             "remove it from --tricks or pick another --base")
    sweep_id = time.strftime("%Y-%m-%d_%H-%M-%S")
    name = req.name or req.mode
    group = req.group or f"{name}-{sweep_id}"
    labels = {"name": name, "id": sweep_id, "group": group, "tricks": list(req.tricks)}
    cfg_of: dict = {}     # variant -> the config of its first run, for the inert check
    first_of: dict = {}   # variant -> (overrides, config) of its first run: the other seeds start from it
    runs = [run_entry(job, cfg_of, first_of) for job in expand_jobs(matrix, seeds, common, labels)]
    if not req.allow_inert:
        check_tricks_act(matrix, cfg_of, {t: (families[t], options[t]) for t in families})
    now = timestamp()
    return {
        "version": 1, "sweep_id": sweep_id, "name": name, "mode": matrix.mode, "base": req.base,
        "tricks": list(req.tricks), "axes": {k: v for k, v in req.axes}, "seeds": seeds,
        "overrides": common, "launcher": req.launcher, "wandb_group": group,
        "created_at": now, "updated_at": now,
        **({"contexts": [c.to_json() for c in req.contexts]} if req.contexts else {}),
        "variants": [v.to_json() for v in matrix.variants],
        "contrasts": [c.to_json() for c in matrix.contrasts],
        "controls": planned_controls(matrix.variants),
        # fixed before the first run: the report decides on this; another summary is exploratory there
        "decides_on": {"metric": DECISION_METRIC, "summary": req.summary or DECISION_SUMMARY},
        # fixed before the first run too: the report tests training against its start in each context
        # (report/training.py) before any trick verdict
        "checks_training": True,
        "runs": runs,
    }


def plan_controls(req: SweepRequest, matrix: Matrix, common: list[str], base_cfg) -> Matrix:
    """`matrix` with the no-RL controls this sweep plans (sweep/controls.py): the untrained base
    in every sweep but a diagnosis (doctor's stages, the conflict check) or a `--family`
    factorial; the SFT control where asked, or unasked where every run trains the embedded
    model (no model.path in the base or any context), in the contexts whose task has reference
    solutions."""
    if req.controls is False:
        return matrix
    # none unasked for doctor's stages and the conflict check (diagnoses), nor for a factorial
    # over config groups (`--family`: settings crossed, fault injection among them, no trick under test)
    unasked_none = req.matrix is not None or req.mode == "conflict" or bool(req.axes)
    kinds = control_kinds(req.controls, not base_cfg.model.get("path"), unasked_none)
    if "sft" not in kinds:
        return with_controls(matrix, kinds)
    contexts = req.contexts or [Context("", ())]
    cfgs = {c.name: _compose(common + list(c.overrides), f"context {c.name}") if c.name else base_cfg
            for c in contexts}
    if req.controls is None and any(cfg.model.get("path") for cfg in cfgs.values()):
        kinds = ("base",)   # a context's own model: an SFT run there costs as much as asking for it
    has = [name for name, cfg in cfgs.items() if _has_solutions(cfg)]
    kinds = kinds if has else ("base",)
    where = tuple(has) if req.contexts and len(has) < len(contexts) else ()   # empty: every context
    return with_controls(matrix, kinds, req.control_budget, where)


def scope_trick_settings(common: list[str], matrix: Matrix) -> tuple[list[str], Matrix]:
    """A setting of a trick family's option given for the whole sweep (`++temperature.lr=100`
    while only some variants have temperature=learnable) goes to the variants whose option has
    that setting: given to the others it would be recorded in a config it cannot act on. A
    setting no variant's option has is refused (a typo) with the allowed ones."""
    scoped, rest = [], []
    for override in common:
        family, _, setting = override.lstrip("+~").split("=", 1)[0].partition(".")
        if family in trick_families() and setting and "." not in setting:
            scoped.append((override, family, setting))
        else:
            rest.append(override)
    if not scoped:
        return common, matrix
    variants, taken = [], set()
    for v in matrix.variants:
        cfg = _compose(rest + list(v.overrides), f"variant {v.name}")
        extra = tuple(o for o, family, setting in scoped if setting in family_keys(cfg, family))
        taken |= set(extra)
        variants.append(replace(v, overrides=v.overrides + extra))
    for override, family, setting in scoped:
        if override not in taken:
            allowed = ", ".join(sorted(family_keys(_compose(rest, "the base"), family))) or "(none)"
            raise SweepError(f"'{override}': {family}.{setting} is not a setting of the {family} option of any "
                             f"variant; allowed: {allowed}")
    return rest, Matrix(matrix.mode, variants, matrix.contrasts)


def check_tricks_act(matrix: Matrix, cfg_of: dict, tricks: dict) -> None:
    """Refuse a plan in which a trick under test cannot act (inert.py): for each contrast, the
    trick on the side that has it; without contrasts (doctor), every trick where all are on;
    for a factorial over config groups, every variant's options. `tricks`: name -> (family, option)."""
    checks = [(c.tested, *tricks[c.tested], c.with_) for c in matrix.contrasts if c.tested in tricks]
    if not matrix.contrasts and matrix.variants:
        widest = max(matrix.variants, key=lambda v: len(v.tricks_on))
        checks += [(t, *tricks[t], widest.name) for t in widest.tricks_on]
    for v in matrix.variants:
        checks += [(f"{key}={value}", key, str(value), v.name) for key, value in v.axes.items()
                   if key in trick_families() or key == "kl.estimator"]
    for name, family, opt, variant in checks:
        reason = inert_reason(cfg_of[variant], family, opt)
        if reason is not None:
            raise SweepError(f"{name} {reason} (or pass --allow-inert to run it anyway)")


def run_entry(job, configs: dict | None = None, firsts: dict | None = None) -> dict:
    """One job as the manifest lists it (pending), its config validated and hashed (and kept
    in `configs` by variant, the first seed's, when given). With `firsts` (variant -> the first
    seed's overrides and config), another seed of a variant is its first's config with this
    seed's values, not a new composition (~1 s each: a 70-run plan composed 70 times)."""
    # a wall-clock SFT control learns its budget from the treatments' runs: checked here with
    # a stand-in, hashed once the budget is known (launch.run_jobs)
    deferred = "control.budget=wall" in job.overrides
    overrides = list(job.overrides) + (["control.wall_s=1"] if deferred else [])
    cfg = other_seed(*firsts[job.variant], overrides) if firsts and job.variant in firsts else None
    if cfg is None:
        cfg = _compose(overrides, f"run {job.run_dir}")
    if firsts is not None:
        firsts.setdefault(job.variant, (overrides, cfg))
    if configs is not None:
        configs.setdefault(job.variant, cfg)
    return {"variant": job.variant, "seed": job.seed, "run_dir": job.run_dir,
            "config_hash": None if deferred else config_hash(cfg), "status": "pending", "step": 0,
            "reason": None, "final_accuracy": None, "overrides": list(job.overrides),
            **({"deferred": "control.wall_s"} if deferred else {})}


# what expand_jobs changes between the seeds of one variant: plain values, set last
PER_SEED_KEYS = {"seed": int, "run.name": str}


def other_seed(first_overrides: list[str], first_cfg, overrides: list[str]):
    """The config `overrides` compose to, from the config of the same variant's first seed when
    the two differ only in PER_SEED_KEYS (else None: compose it). Equal to composing, since
    those overrides are plain values given after every group choice, and interpolations that
    read them (`${seed}`) resolve when read; tests/test_sweep.py checks the hashes agree."""
    if len(first_overrides) != len(overrides):
        return None
    changed = [o for first, o in zip(first_overrides, overrides) if first != o]
    if any(o.split("=", 1)[0] not in PER_SEED_KEYS for o in changed):
        return None
    cfg = copy.deepcopy(first_cfg)
    for o in changed:
        key, value = o.split("=", 1)
        OmegaConf.update(cfg, key, PER_SEED_KEYS[key](value), merge=False)
    return cfg


def _has_solutions(cfg) -> bool:
    return bool(getattr(build_task(cfg.task).train_batch(1, 0, 0)[0], "solution", None))


def _check_overrides(overrides: list[str]) -> None:
    for o in overrides:
        key = o.split("=", 1)[0]
        bare = key.lstrip("+~")
        if key in _RESERVED or bare in _RESERVED:
            raise SweepError(f"'{o}': a sweep sets {bare} itself; use {_RESERVED.get(key, _RESERVED.get(bare))}")
        if bare.split(".")[0] in ("run", "sweep"):
            raise SweepError(f"'{o}': run.* and sweep.* are the labels a sweep gives each run; "
                             "name the sweep with --name")


def _compose(overrides: list[str], what: str):
    try:
        cfg = compose(overrides)
        validate(cfg)
    except ConfigError as err:
        raise SweepError(f"{what}: {err}") from None
    return cfg


def axis_values(spec: str) -> tuple[str, list]:
    """`--family adv` (every option of a config group), `--family task.level` (the values the
    task allows) or `--family key=a,b` (those values)."""
    from importlib import resources

    key, _, values = spec.partition("=")
    key = key.strip()
    if values:
        return key, [_typed(v.strip()) for v in values.split(",") if v.strip()]
    group = resources.files("grpo_ablate.conf").joinpath(key)
    if "." not in key and group.is_dir():
        return key, sorted(p.name[:-5] for p in group.iterdir() if p.name.endswith(".yaml"))

    if key.startswith("task."):
        choices = getattr(TASKS[_compose([], "the defaults").task.name], "CHOICES", {})
        if key[len("task."):] in choices:
            return key, list(choices[key[len("task."):]])
    raise SweepError(f"--family {key}: not a config group and no known values; give them: "
                     f"--family {key}=a,b,c")


def _typed(text: str):
    """`0`, `-1`, `0.5`, `true` as numbers and booleans, anything else as text (YAML rules)."""
    import yaml

    value = yaml.safe_load(text)
    return value if isinstance(value, (int, float, bool)) else text


# ------------------------------------------------------------------------------ the sweep dir
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
    if not isinstance(manifest, dict):
        return "not a JSON object"
    for key, kind in (("runs", list), ("variants", list), ("seeds", list), ("overrides", list)):
        if not isinstance(manifest.get(key), kind):
            return f"no list of {key}"
    if not manifest["runs"]:
        return "no runs"
    for i, run in enumerate(manifest["runs"]):
        if not isinstance(run, dict):
            return f"run {i + 1} is not an object"
        missing = [key for key, kind in _MANIFEST_RUN.items() if not isinstance(run.get(key), kind)]
        if missing:
            return f"run {run.get('run_dir', i + 1)} has no valid {', '.join(missing)}"
    return None


def write_manifest(sweep_dir: Path, manifest: dict) -> None:
    manifest["updated_at"] = timestamp()
    atomic_write_text(Path(sweep_dir) / MANIFEST, json.dumps(manifest, indent=2) + "\n")


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


# ------------------------------------------------------------------------------ launching
def start(req: SweepRequest, console, dry_run: bool = False) -> int:
    """Plan, (dry run: print) create the sweep dir, launch, summarise. Returns the exit code."""
    check_launcher(req.launcher, req.jobs)
    if req.sweep_dir is not None and not dry_run:
        check_new_dir(Path(req.sweep_dir))   # before planning: a taken --dir is refused at once
    manifest = plan(req)
    if dry_run:
        print_matrix(manifest, console)
        if manifest.get("contexts"):
            console.print(contexts_text(manifest, req), markup=False, highlight=False)
        for line in warm_starts_to_build(manifest):
            console.print(line, markup=False, highlight=False)
        return 0
    sweep_dir = create_sweep_dir(req, manifest)
    console.print(f"sweep {manifest['name']}: {len(manifest['variants'])} variants x "
                  f"{len(manifest['seeds'])} seeds = {len(manifest['runs'])} runs -> {sweep_dir}",
                  markup=False, highlight=False)
    with DirLock(sweep_dir, "sweep dir"):
        return run_jobs(sweep_dir, manifest, manifest["runs"], req.launcher, req.jobs, req.hydra_args, console)


def create_sweep_dir(req: SweepRequest, manifest: dict) -> Path:
    """The sweep dir (--dir, else a new one under runs/sweeps/) with its manifest; never an
    existing non-empty one."""
    sweep_dir = Path(req.sweep_dir) if req.sweep_dir else _new_sweep_dir(manifest)
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


def resume(sweep_dir: Path, launcher: str | None, jobs: int | None, hydra_args: list[str], console,
           rerun: tuple = ()) -> int:
    """Skip finished runs, continue killed ones from their checkpoints, rerun failed ones (and
    those named in `rerun`, e.g. one whose status.json was damaged). With nothing to do it
    writes nothing."""
    sweep_dir = Path(sweep_dir)
    manifest = read_manifest(sweep_dir)
    launcher = launcher or manifest.get("launcher", "joblib")
    check_launcher(launcher, jobs)
    names = [run["run_dir"] for run in manifest["runs"]]
    unknown = [name for name in rerun if name not in names]
    if unknown:
        raise SweepError(f"--rerun {', '.join(unknown)}: not a run of {sweep_dir}; its runs: "
                         f"{', '.join(names[:6])}{', ...' if len(names) > 6 else ''}")
    todo, changed, statuses = [], [], {}
    for run in manifest["runs"]:
        run_dir = sweep_dir / run["run_dir"]
        try:
            status = None if run["run_dir"] in rerun or not run_dir.exists() else read_status(run_dir)
        except DamagedFile as err:
            raise SweepError(f"run {run['run_dir']}: {err.path.name} {err.problem}; re-run it with "
                             f"`grpo-ablate sweep --resume {sweep_dir} --rerun {run['run_dir']}`") from None
        statuses[run["run_dir"]] = status
        if status is not None and status.get("config_hash") != run["config_hash"]:
            changed.append(run["run_dir"])
        elif status is not None and status["state"] in FINISHED:
            continue                                   # a result: never rewritten
        else:
            todo.append(run)
    alive = [run["run_dir"] for run in todo if still_running(sweep_dir / run["run_dir"])]
    if alive:
        raise SweepError(f"{', '.join(alive[:3])}{', ...' if len(alive) > 3 else ''} is still being trained by "
                         "a live process on this machine (an earlier launch of this sweep); wait for it "
                         "or stop it before resuming")
    if changed:
        raise SweepError(f"{len(changed)} run(s) in {sweep_dir} hold a different config than the manifest "
                         f"({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''}); a sweep is only "
                         "resumed with the config it was started with")
    stale = [run["run_dir"] for run in todo
             if not run.get("deferred") and _config_hash(run["overrides"]) != run["config_hash"]]
    if stale:
        raise SweepError(f"the config of {', '.join(stale[:3])} composes differently now than when the sweep "
                         "started (the code or conf/ changed); start a new sweep")
    if not todo:   # nothing to do: nothing is written
        console.print(f"{sweep_dir}: all {len(names)} runs finished; nothing to do", markup=False, highlight=False)
        refresh_statuses(sweep_dir, manifest)   # in memory, for the summary
        print_summary(manifest, console, sweep_dir)
        return 0 if all(run["status"] in FINISHED for run in manifest["runs"]) else 1
    for run in todo:   # a failed run starts over; its dir is kept aside, never deleted
        run_dir, status = sweep_dir / run["run_dir"], statuses[run["run_dir"]]
        asked = run["run_dir"] in rerun and run_dir.exists()
        if asked or status is not None and status["state"] == "failed":
            stamp = time.strftime("%Y%m%d-%H%M%S")
            aside = sweep_dir / (".rerun" if asked else ".failed") / f"{run['run_dir']}.{stamp}"
            aside.parent.mkdir(exist_ok=True)
            os.rename(run_dir, aside)
            why = "rerun as asked" if asked else f"had failed ({status.get('reason')})"
            console.print(f"{run['run_dir']} {why}; rerunning it (old run kept in {aside})",
                          markup=False, highlight=False)
    done = len(manifest["runs"]) - len(todo)
    console.print(f"resuming {sweep_dir}: {done} of {len(manifest['runs'])} runs finished, "
                  f"{len(todo)} to run", markup=False, highlight=False)
    return run_jobs(sweep_dir, manifest, todo, launcher, jobs, hydra_args, console, resume=True)


def still_running(run_dir: Path) -> bool:
    """A run whose status says running and whose writer process is alive on this host (a
    parallel worker can outlive a killed sweep process; two writers must never share a dir)."""
    import socket

    status = read_status(run_dir) if run_dir.exists() else None
    if not status or status["state"] != "running" or status.get("host") != socket.gethostname():
        return False
    try:
        pid = int(status["pid"])
        os.kill(pid, 0)
        command = Path(f"/proc/{pid}/cmdline").read_bytes() if Path("/proc").exists() else b"python"
    except (OSError, TypeError, KeyError, ValueError):
        return False
    return pid != os.getpid() and b"python" in command   # not a recycled pid of something else


def _config_hash(overrides: list[str]) -> str:
    return config_hash(_compose(list(overrides), "a resumed run"))


def run_jobs(sweep_dir: Path, manifest: dict, todo: list[dict], launcher: str, jobs: int | None,
             hydra_args: list[str], console, resume: bool = False) -> int:
    """Launch `todo` (runs of the manifest) through Hydra, record how each ended, print the summary;
    0 when every run of the sweep finished (completed or diverged). Shared by start, resume and
    the sequential sweep's looks."""
    try:
        outcomes = _launch_now_and_later(sweep_dir, manifest, todo, launcher, jobs, hydra_args, console, resume)
    except KeyboardInterrupt:   # Ctrl-C: each run records `interrupted` itself (stopping.py); so does the sweep
        refresh_statuses(sweep_dir, manifest)
        write_manifest(sweep_dir, manifest)
        console.print(f"stopped (Ctrl-C): `grpo-ablate sweep --resume {sweep_dir}` continues it (interrupted runs "
                      "from their checkpoints)", markup=False, highlight=False)
        return 130
    refresh_statuses(sweep_dir, manifest, outcomes)
    write_manifest(sweep_dir, manifest)
    print_summary(manifest, console, sweep_dir)
    return 0 if all(run["status"] in FINISHED for run in manifest["runs"]) else 1


def _launch_now_and_later(sweep_dir: Path, manifest: dict, todo: list[dict], launcher: str, jobs: int | None,
                          hydra_args: list[str], console, resume: bool) -> dict:
    """The runs that can start now, then the SFT controls that wait for the treatments' time."""
    outcomes: dict = {}
    now = [run for run in todo if not run.get("deferred")]
    later = [run for run in todo if run.get("deferred")]
    if now:
        _warm_start(now, console)
        outcomes.update(_launch(sweep_dir, manifest, now, launcher, jobs, hydra_args, console, resume))
    if later:   # SFT controls on a wall-clock budget: the treatments' training time, known now
        refresh_statuses(sweep_dir, manifest, outcomes)
        context_of = {v["name"]: v.get("context") for v in manifest["variants"]}
        for run in later:   # the treatments of its own context (a sweep across contexts)
            wall_s = treatment_train_seconds(sweep_dir, manifest, context_of.get(run["variant"]))
            if wall_s is None:
                run.update(status="failed", reason="no completed treatment run to take the wall-clock "
                                                   "budget (control.budget=wall) from")
                continue
            run["overrides"] = run["overrides"] + [f"control.wall_s={max(wall_s, 0.1):.1f}"]
            run["config_hash"] = _config_hash(run["overrides"])
            del run["deferred"]
        later = [run for run in later if "deferred" not in run and run["status"] != "failed"]
        if later:
            budgets = sorted({o.split("=", 1)[1] for run in later for o in run["overrides"]
                              if o.startswith("control.wall_s=")}, key=float)
            console.print(f"SFT control budget: {', '.join(budgets)} s of training (the median of the treatment "
                          f"runs{' of each context' if any(context_of.values()) else ''})",
                          markup=False, highlight=False)
            outcomes.update(_launch(sweep_dir, manifest, later, launcher, jobs, hydra_args, console, resume))
    return outcomes


def treatment_train_seconds(sweep_dir: Path, manifest: dict, context: str | None = None) -> float | None:
    """Median training time (the sum of time/step_s: eval excluded) of the completed treatment runs
    (of `context`, in a sweep across contexts)."""
    treatments = {v["name"] for v in manifest["variants"]
                  if v.get("kind", "treatment") == "treatment" and (context is None or v.get("context") == context)}
    seconds = [sum(r.get("time/step_s") or 0.0 for r in read_rows(Path(sweep_dir) / run["run_dir"] / "metrics.jsonl"))
               for run in manifest["runs"] if run["variant"] in treatments and run["status"] == "completed"]
    return statistics.median(seconds) if seconds else None


def _launch(sweep_dir: Path, manifest: dict, todo: list[dict], launcher: str, jobs: int | None,
            hydra_args: list[str], console, resume: bool) -> dict:
    """One batch of runs through Hydra's launcher; returns how each job ended."""
    local = launcher in ("basic", "joblib", "submitit_local")   # the runs share this machine's cores
    n_parallel = 1 if launcher == "basic" else max(1, min(jobs or (cpus() if local else len(todo)), len(todo)))
    # parallel local runs split the cores, never oversubscribe; on a cluster each job has its own
    threads = max(1, cpus() // n_parallel) if local else None
    launch_dir = sweep_dir / ".launch"
    launch_dir.mkdir(exist_ok=True)
    jobs_file, results_file = launch_dir / "jobs.json", launch_dir / "results.json"
    job_list = [{"name": run["run_dir"],
                 "overrides": _with_threads(run["overrides"], threads) + (["resume=true"] if resume else [])}
                for run in todo]
    atomic_write_text(jobs_file, json.dumps(job_list, indent=2) + "\n")
    results_file.unlink(missing_ok=True)
    args = ["-m", "hydra/sweeper=grpo_ablate", f"hydra.sweeper.jobs_file={_quote(jobs_file)}",
            f"hydra.sweeper.results_file={_quote(results_file)}",
            f"hydra/launcher={LAUNCHERS[launcher][0]}", f"hydra.sweep.dir={_quote(sweep_dir)}",
            "hydra/hydra_logging=disabled"]
    if launcher == "basic":
        args.append("hydra.sweeper.max_batch_size=1")     # record each run as it ends
    elif launcher == "joblib":
        args.append(f"hydra.launcher.n_jobs={n_parallel}")
    elif launcher == "submitit_local":                    # it starts every job it is given at once
        args += [f"hydra.sweeper.max_batch_size={n_parallel}", f"hydra.launcher.cpus_per_task={threads}"]
    elif launcher == "submitit_slurm":
        if jobs:                                          # one job array, at most --jobs running
            args.append(f"hydra.launcher.array_parallelism={jobs}")
        watch_jobs_without_sacct()                        # no accounting: job states from squeue
    manifest["launcher"] = launcher
    for run in todo:
        run["status"] = "launched"
    write_manifest(sweep_dir, manifest)
    fixed = next((o.split("=", 1)[1] for o in todo[0]["overrides"] if o.startswith("threads=")), None)
    shown = fixed or threads                              # the user's threads= wins over the share
    share = f", {shown} thread{'s' if str(shown) != '1' else ''} each" if shown else ""
    console.print(f"launching {len(todo)} run{'s' if len(todo) > 1 else ''} with the {launcher} launcher "
                  f"({n_parallel} at a time{share})", markup=False, highlight=False)
    from hydra_plugins.grpo_ablate_sweeper.grpo_ablate_sweeper import register

    register()
    from grpo_ablate import entrypoint   # the training stack (torch, transformers): only once runs start
    entrypoint.run_hydra(args + list(hydra_args))
    return json.loads(results_file.read_text()) if results_file.exists() else {}


def warm_starts_to_build(manifest: dict) -> list[str]:
    """The embedded models a sweep will warm-start before its first run (not cached yet), one line each:
    a context with another task (`--across task.level=easy,hard`) needs a model of its own."""
    seen, targets, lines = set(), set(), []
    for run in manifest["runs"]:
        if run["variant"] in seen:
            continue
        seen.add(run["variant"])
        cfg = _compose(list(run["overrides"]), f"run {run['run_dir']}")
        if cfg.model.get("path") or gguf_source(cfg.model) is not None:
            continue
        target = warm_start_dir(cfg.model, build_task(cfg.task))
        if not (target / "config.json").exists() and target not in targets:
            targets.add(target)
            lines.append(f"first warm-starts the embedded model for {run['variant']} (not cached yet; minutes "
                         f"on 2 cores), cached as {target}")
    return lines


def _with_threads(overrides: list[str], threads: int | None) -> list[str]:
    """The launcher's thread share, unless the user fixed `threads=` for the sweep."""
    if threads is None or any(o.startswith("threads=") for o in overrides):
        return list(overrides)
    return list(overrides) + [f"threads={threads}"]


def _warm_start(todo: list[dict], console) -> None:
    """Build each distinct embedded model (and convert each GGUF file) once, here, before parallel runs
    would race to."""
    from grpo_ablate.models import ensure_warm_started, model_dir   # torch: only once runs start
    seen = set()
    for run in todo:
        cfg = _compose(list(run["overrides"]), f"run {run['run_dir']}")
        if gguf_source(cfg.model) is not None:   # a GGUF model: converted once (cached by its bytes)
            model_dir(cfg.model, log=lambda m: console.print(m, markup=False, highlight=False))
            continue
        if cfg.model.get("path"):
            continue
        key = json.dumps([_container(cfg.model), _container(cfg.task)], sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            ensure_warm_started(cfg.model, build_task(cfg.task),
                                log=lambda m: console.print(m, markup=False, highlight=False))


def _container(node):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True)


def check_launcher(launcher: str, jobs: int | None) -> None:
    """SweepError unless `launcher` is known, its plugin installed and `jobs` fits it."""
    if launcher not in LAUNCHERS:
        raise SweepError(f"--launcher {launcher} is not allowed; allowed: {', '.join(LAUNCHERS)}")
    _, module, extra = LAUNCHERS[launcher]
    if module and importlib.util.find_spec(module) is None:
        raise SweepError(f"--launcher {launcher} needs its Hydra plugin: pip install '{extra}'")
    if jobs is not None and jobs < 1:
        raise SweepError(f"--jobs {jobs} is not allowed; it must be >= 1")
    if jobs is not None and jobs > 1 and launcher == "basic":
        raise SweepError("--jobs > 1 needs a parallel launcher (joblib, submitit_local, ...); "
                         "basic runs one job at a time")


def cpus() -> int:
    """The cores this process may use (local launchers split them among parallel runs)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _quote(path: Path) -> str:
    """A path as a Hydra override value (quoted, so any character is allowed)."""
    return "'" + str(Path(path).resolve()).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _new_sweep_dir(manifest: dict) -> Path:
    path = Path("runs") / "sweeps" / manifest["wandb_group"]
    suffix = 1
    while path.exists():
        suffix += 1
        path = Path("runs") / "sweeps" / f"{manifest['wandb_group']}-{suffix}"
    return path


def timestamp() -> str:
    """Local time as the manifests record it."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# ------------------------------------------------------------------------------ output
def print_matrix(manifest: dict, console) -> None:
    from rich.table import Table
    from rich.text import Text

    seeds = manifest["seeds"]
    table = Table(title=f"sweep {manifest['name']} ({manifest['mode']}): {len(manifest['variants'])} variants x "
                        f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''} ({', '.join(map(str, seeds))}) = "
                        f"{len(manifest['runs'])} runs; nothing written")
    table.add_column("variant", no_wrap=True)   # names stay whole and copy-pasteable
    table.add_column("tricks on", overflow="fold")
    table.add_column("overrides", overflow="fold")
    common = " ".join(manifest["overrides"])
    for v in manifest["variants"]:
        table.add_row(v["name"], ", ".join(v["tricks_on"]) or "-",   # Text: "[a,b]" is not markup
                      Text(" ".join(filter(None, [common, *v["overrides"]])) or "(the defaults)"))
    console.print(table)


def contexts_text(manifest: dict, req: SweepRequest, wall: bool = True) -> str:
    """--dry-run across contexts: the runs in each context, and (`wall`) what the grid costs."""
    lines = []
    for c in manifest["contexts"]:
        variants = [v for v in manifest["variants"] if v.get("context") == c["name"]]
        runs = [r for r in manifest["runs"] if r["variant"] in {v["name"] for v in variants}]
        lines.append(f"  {c['name']}: {len(variants)} variants, {len(runs)} runs "
                     f"({' '.join(c['overrides']) or 'no overrides'})")
    contrasts = len(manifest["contrasts"])
    head = (f"across {len(manifest['contexts'])} contexts: {len(manifest['runs'])} runs, "
            f"{contrasts} contrasts (each trick in each context)")
    return "\n".join([head, *lines, *([expected_wall(len(manifest["runs"]), req)] if wall else [])])


def print_summary(manifest: dict, console, sweep_dir: Path) -> None:
    """Variant x seed -> status and final eval accuracy."""
    from rich.table import Table

    seeds = manifest["seeds"]
    by_key = {(r["variant"], r["seed"]): r for r in manifest["runs"]}
    table = Table(title=f"sweep {manifest['name']}: final eval accuracy by variant and seed")
    table.add_column("variant", no_wrap=True)
    for s in seeds:
        table.add_column(f"seed {s}", justify="right")
    for v in manifest["variants"]:
        cells = []
        for s in seeds:
            run = by_key.get((v["name"], s))
            if run is None:
                cells.append("-")
            elif run["status"] == "completed" and run["final_accuracy"] is not None:
                cells.append(f"{run['final_accuracy']:.3f}")
            elif run["status"] == "diverged":
                cells.append(f"diverged@{run['step']}")
            else:
                cells.append(run["status"] + (f"@{run['step']}" if run["step"] else ""))
        table.add_row(v["name"], *cells)
    console.print(table)
    counts = {}
    for run in manifest["runs"]:
        counts[run["status"]] = counts.get(run["status"], 0) + 1
    console.print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f"  ({sweep_dir})",
                  markup=False, highlight=False)
    for run in manifest["runs"]:
        if run["status"] == "failed":
            console.print(f"  {run['run_dir']} failed: {run['reason']}", markup=False, highlight=False)
        elif run["status"] == INTERRUPTED:   # stopped from outside (a time limit): --resume continues it
            console.print(f"  {run['run_dir']} interrupted at step {run['step']}: {run['reason']}; "
                          f"`grpo-ablate sweep --resume {sweep_dir}` continues it", markup=False, highlight=False)


# ------------------------------------------------------------------------------ timing
def measured_run_seconds(parent: Path) -> tuple[float, str] | None:
    """The median wall time of the completed runs of the newest sweep in `parent`, and which."""
    manifests = sorted(Path(parent).glob("*/manifest.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in manifests:
        seconds = [s["wall_time_s"] for s in (read_status(d) for d in path.parent.iterdir() if d.is_dir()
                                              and (d / "status.json").exists())
                   if s and s.get("state") == "completed" and s.get("wall_time_s")]
        if seconds:
            return statistics.median(seconds), f"the median of {len(seconds)} runs of {path.parent}"
    return None


def run_timing(req: SweepRequest) -> tuple[float, str, int] | None:
    """(seconds a run, where that figure comes from, runs at a time), or None when no finished
    sweep beside this one has timed a run."""
    parent = Path(req.sweep_dir).parent if req.sweep_dir else Path("runs") / "sweeps"
    measured = measured_run_seconds(parent) if parent.is_dir() else None
    if measured is None:
        return None
    parallel = 1 if req.launcher == "basic" else max(1, req.jobs or cpus())
    return (*measured, parallel)


def expected_wall(runs: int, req: SweepRequest) -> str:
    """What `runs` runs cost in wall time, from the runs of the newest finished sweep beside this one."""
    measured = run_timing(req)
    if measured is None:
        parent = Path(req.sweep_dir).parent if req.sweep_dir else Path("runs") / "sweeps"
        return f"expected wall time: unknown (no finished sweep in {parent} to time a run from)"
    per_run, source, parallel = measured
    return (f"expected wall time of {runs} runs: ~{duration(math.ceil(runs / parallel) * per_run)} "
            f"({per_run:.0f} s a run, {source}; {parallel} at a time)")


def duration(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"
