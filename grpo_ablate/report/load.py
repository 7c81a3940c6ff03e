"""Reading a sweep dir: its manifest, its run dirs, which variants are controls, which pairs are contrasts.

Reads only files (the run-dir contract of `grpo_ablate/rundir/files.py`): the sweep's
`manifest.json` and, per run dir, `metrics.jsonl`, `samples.jsonl`, `evals.jsonl` (each eval's
per-problem scores), `status.json` and `config.yaml`. Nothing here raises for a missing or
damaged run: what is missing or odd is said in the run's (or the sweep's) `notes`, and a run
left out for a damaged file, or for not being this sweep's (nor of its start: rundir/starts.py), in
`Sweep.warnings` too (one line each, for the command to print). A damaged manifest is a ReportError
(report/schema.py). Without a manifest the run dirs found are grouped by their config, and the
contrasts are inferred from the tricks each variant has on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import yaml

from grpo_ablate.design import CONTROLS, Context, Contrast, Variant
from grpo_ablate.errors import DamagedFile, ReportError
from grpo_ablate.report.health import BREAKING_FLAGS, HealthThresholds, health_flags
from grpo_ablate.evals.scores import read_evals
from grpo_ablate.report.schema import (accuracy_problem, foreign_problem, manifest_problem, outside_problem,
                                       status_problem)
from grpo_ablate.rundir.files import EVALS, read_json, read_jsonl, read_status
from grpo_ablate.rundir.starts import other_starts, recorded_start, start_notes

FINISHED = ("completed", "diverged", "failed", "interrupted")   # interrupted: waits for --resume
# Control runs: `base` is the starting policy never trained, `sft` the same budget spent on supervised
# training on gold solutions, `rft` on the policy's own verified-correct samples. Each gets a "Δ vs" column.
CONTROL_NAMES = CONTROLS               # role -> what a sweep names it (design.py)
CONTROL_ROLES = tuple(CONTROL_NAMES)   # the order of their columns and rows
CONTROL_LABELS = {"base": "the untrained base", "sft": "the SFT control", "rft": "the RFT control"}
CONTROL_COLUMNS = {"base": "Δ vs base", "sft": "Δ vs SFT control", "rft": "Δ vs RFT control"}


@dataclass
class Run:
    variant: str
    seed: int | None
    run_dir: Path
    state: str = "missing"           # completed | diverged | failed | running | missing
    step: int | None = None
    reason: str | None = None
    wall_time_s: float | None = None
    max_new_tokens: int | None = None
    metrics: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"step": []}))
    samples: list = field(default_factory=list)
    config: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)   # what is missing or odd, in words
    nonfinite: dict = field(default_factory=dict)   # column -> the first step that logged NaN or Inf in it
    flags: list = field(default_factory=list)
    evals: dict = field(default_factory=dict)   # step -> its eval's ProblemScores (evals.jsonl: evals/scores.py)
    config_hash: str | None = None              # status.json's: what the run actually trained
    start: dict | None = None                   # status.json's: what it started from (None: not recorded)
    damage: tuple | None = None                 # (file, what is wrong with it): the run is left out (schema.py)
    left_out: bool = False                      # out of every statistic (leave_out)

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def key(self):
        """What pairs runs across variants: the seed (the dir name when the seed is unknown)."""
        return self.seed if self.seed is not None else self.name

    @property
    def broken(self) -> bool:
        return self.state == "diverged" or any(f.name in BREAKING_FLAGS for f in self.flags)


@dataclass
class Sweep:
    dir: Path
    name: str
    sweep_id: str | None = None
    mode: str | None = None
    base: str | None = None
    seeds: list = field(default_factory=list)
    variants: list[Variant] = field(default_factory=list)     # controls last, with their role
    contrasts: list[Contrast] = field(default_factory=list)   # none with a control on either side
    runs: list = field(default_factory=list)
    wandb_group: str | None = None
    manifest_found: bool = True
    notes: list = field(default_factory=list)
    controls: dict = field(default_factory=dict)    # role (base | sft | rft) -> control variant name
    sequential: dict | None = None                  # a --seeds auto sweep's looks (manifest `sequential`)
    contexts: list[Context] = field(default_factory=list)    # a sweep across contexts (report/transfer.py)
    decides_on: dict | None = None                  # {metric, summary} fixed in the manifest before the first run
    # a sweep across contexts: context -> role -> that context's control (`controls` then names
    # them as `control-base@<context>`, for the columns and the text)
    context_controls: dict = field(default_factory=dict)
    checks_training: bool = False                   # the manifest fixed the training-vs-start test
    warnings: list = field(default_factory=list)    # one line per run left out, for stderr (also in its notes)
    expected_pairs: list = field(default_factory=list)   # pair rules the sweep asks about: not in its notes

    def control_of(self, context: str | None, role: str) -> str | None:
        """The `role` control the variants of `context` (None: the sweep's only one) are compared with."""
        if self.context_controls:
            return self.context_controls.get(context, {}).get(role)
        return self.controls.get(role)


# --------------------------------------------------------------------------- one run dir
def metrics_frame(rows: list[dict]) -> pd.DataFrame:
    """One row per step (the last one written wins), numeric columns, nulls as NaN."""
    rows = [r for r in rows if isinstance(r.get("step"), (int, float)) and math.isfinite(r["step"])]
    if not rows:
        return pd.DataFrame({"step": pd.Series([], dtype="int64")})
    df = pd.DataFrame(rows)
    for name in df.select_dtypes(include="object").columns:   # the others are numbers already
        df[name] = pd.to_numeric(df[name], errors="coerce")
    df["step"] = df["step"].astype("int64")
    return df.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)


def nonfinite_steps(rows: list[dict]) -> dict:
    """column -> the first step whose logged value is NaN or ±Inf, or null, which is how the trainer
    writes them (rundir.finite_or_none); a missing key is not one: in the frame all read as NaN,
    so this is read from the rows themselves."""
    found: dict = {}
    for r in rows:
        for key, value in r.items():
            bad = value is None or isinstance(value, float) and not math.isfinite(value)
            if bad and key not in found:
                found[key] = r.get("step")
    return found


def nested_value(data: dict, *keys):
    """data[k1][k2]...: None where a level is missing or not a mapping (a config.yaml read as is)."""
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


# libyaml's safe loader where PyYAML was built with it (its wheels are): the same documents, ~10x
# faster than the pure-Python one, and a report reads one config.yaml per run
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(path: Path, problems: list) -> dict:
    """config.yaml as a mapping; {} and what was wrong (in `problems`) when it is not one."""
    try:
        data = yaml.load(path.read_text(), Loader=SAFE_LOADER)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        problems.append(f"cannot be read as YAML ({type(err).__name__})")
        return {}
    if not isinstance(data, dict):
        problems.append("is not a YAML mapping")
        return {}
    return data


def _read_status(run: Run) -> dict | None:
    """status.json, None when there is none or it is damaged (then the run's damage)."""
    try:
        status = read_status(run.run_dir)
    except DamagedFile as err:
        run.damage = run.damage or ("status.json", err.problem)
        return None
    if status is None:
        run.notes.append("no status.json")
    elif problem := status_problem(status):
        run.damage = run.damage or ("status.json", f"is damaged ({problem})")
        return None
    return status


def _read_logs(run: Run, status: dict | None) -> None:
    """metrics.jsonl, samples.jsonl and evals.jsonl into the run; an accuracy outside [0, 1] or
    per-problem scores that are not scores are the run's damage."""
    if (run.run_dir / "metrics.jsonl").exists():
        rows, problems = read_jsonl(run.run_dir / "metrics.jsonl")
        run.notes += [f"metrics.jsonl: {p}" for p in problems]
        run.metrics = metrics_frame(rows)
        run.nonfinite = nonfinite_steps(rows)
        if run.metrics.empty:
            run.notes.append("metrics.jsonl is empty")
        if problem := accuracy_problem(rows):
            run.damage = run.damage or ("metrics.jsonl", f"is damaged ({problem})")
    elif status is None or status.get("state") != "running":
        run.notes.append("no metrics.jsonl")
    if (run.run_dir / "samples.jsonl").exists():
        run.samples, _ = read_jsonl(run.run_dir / "samples.jsonl")
    if (run.run_dir / EVALS).exists():   # older runs have none: the report then counts seeds only
        rows, problems = read_jsonl(run.run_dir / EVALS)
        run.notes += [f"{EVALS}: {p}" for p in problems]   # a torn or unparsable line: that eval's scores are gone
        run.evals, problem = read_evals(rows)
        if problem:
            run.damage = run.damage or (EVALS, f"is damaged ({problem})")


def load_run(run_dir: Path, variant: str, seed: int | None, thresholds: HealthThresholds) -> Run:
    """One run dir as the report sees it; never raises for missing or damaged files (a damaged
    one is the run's `damage`: the sweep leaves the run out)."""
    run = Run(variant=variant, seed=seed, run_dir=Path(run_dir))
    if not run.run_dir.is_dir():
        run.notes.append("not started (no run dir)")
        return run
    if (run.run_dir / "config.yaml").exists():
        problems = []
        run.config = _read_yaml(run.run_dir / "config.yaml", problems)
        run.damage = ("config.yaml", problems[0]) if problems else None
        tokens = nested_value(run.config, "rollout", "max_new_tokens")
        run.max_new_tokens = int(tokens) if isinstance(tokens, (int, float)) else None
        if run.seed is None and isinstance(run.config.get("seed"), int):
            run.seed = run.config["seed"]
    else:
        run.notes.append("no config.yaml")

    status = _read_status(run)
    _read_logs(run, status)
    if status is not None:
        run.config_hash, run.start = status.get("config_hash"), recorded_start(status)
        run.state = status["state"]
        run.step, run.reason = status["step"], status.get("reason")
        run.wall_time_s = status.get("wall_time_s")
        # status.json says finished but there is nothing to read: as good as missing
        if run.metrics.empty and run.state != "running":
            run.notes.append(f"status.json says {run.state}, but there are no metrics")
            run.state = "missing"
    run.flags = health_flags(run.metrics, run.samples, run.max_new_tokens, thresholds, status)
    return run


def leave_out(sweep: Sweep, run: Run, why: str, where: Path | str) -> None:
    """The run takes no part in any statistic (as failed, with nothing of it read), said in its
    notes and in one warning line naming `where` (the file, or the run dir)."""
    run.state, run.flags, run.evals, run.nonfinite, run.samples = "failed", [], {}, {}, []
    run.left_out = True
    run.metrics = metrics_frame([])
    run.notes.append(f"{why}: left out of every statistic")
    sweep.warnings.append(f"warning: {where}: {why}; the report goes on without this run")


def _leave_out_damaged(sweep: Sweep) -> None:
    for run in sweep.runs:
        if run.damage:
            file, problem = run.damage
            leave_out(sweep, run, f"{file} {problem}", run.run_dir)


def _leave_out_other_starts(sweep: Sweep) -> None:
    """Runs that started from other weights than the sweep's other runs of their model (another machine's
    warm start: rundir/starts.py) are left out, as a foreign run is; the notes name them."""
    starts = {run.name: run.start for run in sweep.runs if not run.left_out and run.state != "missing"}
    for other in other_starts(starts):
        run = next(r for r in sweep.runs if r.name == other.run)
        leave_out(sweep, run, f"not this sweep's start: {other.why}", run.run_dir)
    sweep.notes += start_notes(starts)


# --------------------------------------------------------------------------- a sweep dir
def load_sweep(sweep_dir: Path, thresholds: HealthThresholds | None = None) -> Sweep:
    """The sweep from its manifest, or, without one, from the run dirs found in it."""
    thresholds = thresholds or HealthThresholds()
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ReportError(f"{sweep_dir}: no such directory")
    path = sweep_dir / "manifest.json"
    if not path.exists():
        sweep = _scan_sweep(sweep_dir, thresholds)
        sweep.notes.insert(0, "manifest.json is missing: grouped the run dirs found by their config (sweep.variant, "
                              "else run.job_type)")
    else:
        sweep = _sweep_from_manifest(sweep_dir, read_manifest(path), thresholds)
    _leave_out_damaged(sweep)
    _leave_out_other_starts(sweep)
    return sweep


def read_manifest(path: Path) -> dict:
    """manifest.json of the shape the report reads (schema.py), else one line naming it: without
    it the report cannot tell which runs are the sweep's."""
    way_out = f"restore it, or move it aside to report the run dirs in {path.parent} grouped by their config"
    try:
        manifest = read_json(path, "manifest")
    except DamagedFile as err:
        raise ReportError(f"{err}; {way_out}") from None
    problem = manifest_problem(manifest)
    if problem:
        raise ReportError(f"{path} is damaged ({problem}); {way_out}")
    return manifest


def _sweep_from_manifest(sweep_dir: Path, manifest: dict, thresholds: HealthThresholds) -> Sweep:
    """Variants, contrasts and runs as manifest version 1 lists them (see sweep/manifest.py)."""
    sweep = Sweep(dir=sweep_dir, name=str(manifest.get("name") or sweep_dir.name),
                  sweep_id=manifest.get("sweep_id"), mode=manifest.get("mode"), base=manifest.get("base"),
                  seeds=list(manifest.get("seeds") or []), wandb_group=manifest.get("wandb_group"),
                  sequential=manifest["sequential"] if isinstance(manifest.get("sequential"), dict) else None,
                  decides_on=manifest["decides_on"] if isinstance(manifest.get("decides_on"), dict) else None,
                  checks_training=manifest.get("checks_training") is True,
                  expected_pairs=list(manifest.get("expected_pairs") or []))
    if manifest.get("version", 1) != 1:
        sweep.notes.append(f"manifest version {manifest.get('version')!r}; read as version 1")
    # the design is read here, once; an entry without its name (or a contrast without a side) is skipped
    sweep.variants = [Variant.from_json(v) for v in manifest.get("variants") or []
                      if isinstance(v, dict) and v.get("name")]
    sweep.contexts = [Context.from_json(c) for c in manifest.get("contexts") or []
                      if isinstance(c, dict) and c.get("name")]
    sweep.contrasts = [Contrast.from_json(c) for c in manifest.get("contrasts") or []
                       if isinstance(c, dict) and {"trick", "with", "without"} <= c.keys()]
    entries = manifest.get("runs")
    if not isinstance(entries, list):  # a manifest without its run list: the matrix says what to expect
        sweep.notes.append("manifest.json lists no runs: expected <variant>-s<seed> for every variant and seed")
        entries = [{"variant": v.name, "seed": s} for v in sweep.variants for s in sweep.seeds]
    known = {v.name for v in sweep.variants}
    for entry in entries:
        if not entry.get("variant"):
            continue
        if entry["variant"] not in known:
            known.add(entry["variant"])
            sweep.variants.append(Variant(entry["variant"]))
        sweep.runs.append(_manifest_run(sweep, entry, manifest, thresholds))
    _untestable_contrasts(sweep, known)
    identify_controls(sweep, manifest.get("controls"), by_name=False)
    return sweep


def _manifest_run(sweep: Sweep, entry: dict, manifest: dict, thresholds: HealthThresholds) -> Run:
    """The run a manifest entry names, left out when it is not this sweep's: its run dir outside the
    sweep dir (not read), another sweep's id or other steps in its config.yaml, another config hash
    than the one planned (its job composed conf/ after it had changed)."""
    variant, seed = entry["variant"], entry.get("seed")
    name = entry.get("run_dir") or f"{variant}-s{seed}"
    if outside := outside_problem(name, sweep.dir):
        run = Run(variant=variant, seed=seed, run_dir=Path(name))
        leave_out(sweep, run, f"not this sweep's run ({outside})", sweep.dir / "manifest.json")
        return run
    run = load_run(sweep.dir / name, variant, seed, thresholds)
    planned, trained = entry.get("config_hash"), run.config_hash
    why = foreign_problem(run.config, entry, manifest) if run.state != "missing" else None
    if why is None and run.state != "missing" and planned and trained and planned != trained:
        why = (f"it trained another config than the sweep planned (config hash {trained}, planned {planned}: conf/ "
               "or the code changed while the sweep ran)")
    if why is not None and run.damage is None:
        leave_out(sweep, run, f"not this sweep's run: {why}", run.run_dir)
    return run


def _untestable_contrasts(sweep: Sweep, variants: set) -> None:
    """A contrast naming a variant the sweep does not have tests nothing: said, and left out."""
    missing = [c for c in sweep.contrasts if c.with_ not in variants or c.without not in variants]
    for c in missing:
        absent = ", ".join(v for v in (c.with_, c.without) if v not in variants)
        sweep.notes.append(f"contrast {c.trick} ({c.with_} vs {c.without}) names no variant of this sweep "
                           f"({absent}): left out of the trick verdicts")
        sweep.warnings.append(f"warning: {sweep.dir / 'manifest.json'}: contrast {c.trick} names {absent}, no "
                              "variant of this sweep; the report goes on without it")
    sweep.contrasts = [c for c in sweep.contrasts if c not in missing]


def _scan_sweep(sweep_dir: Path, thresholds: HealthThresholds) -> Sweep:
    """No manifest: every subdir with a config.yaml, status.json or metrics.jsonl is a run."""
    dirs = [d for d in sorted(sweep_dir.iterdir()) if d.is_dir() and any(
        (d / f).exists() for f in ("config.yaml", "status.json", "metrics.jsonl"))]
    if not dirs:
        raise ReportError(f"{sweep_dir}: no manifest.json and no run dirs in it "
                          "(subdirectories with config.yaml, status.json or metrics.jsonl)")
    sweep = Sweep(dir=sweep_dir, name=sweep_dir.name, manifest_found=False)
    variants: dict[str, Variant] = {}
    for d in dirs:
        config = _read_yaml(d / "config.yaml", []) if (d / "config.yaml").exists() else {}
        variant = str(nested_value(config, "sweep", "variant") or nested_value(config, "run", "job_type") or d.name)
        seed = config.get("seed") if isinstance(config.get("seed"), int) else None
        sweep.runs.append(load_run(d, variant, seed, thresholds))
        tricks = config.get("tricks") if isinstance(config.get("tricks"), dict) else {}
        variants.setdefault(variant, Variant(variant, tuple(sorted(tricks))))
        sweep.name = str(nested_value(config, "sweep", "name") or sweep.name)
        sweep.sweep_id = nested_value(config, "sweep", "id") or sweep.sweep_id
        sweep.mode = nested_value(config, "sweep", "mode") or sweep.mode
        sweep.wandb_group = nested_value(config, "run", "group") or sweep.wandb_group
    _one_sweep_only(sweep_dir, dirs, sweep.runs)
    sweep.variants = list(variants.values())
    sweep.seeds = sorted({r.seed for r in sweep.runs if r.seed is not None})
    identify_controls(sweep, None, by_name=True)
    # a control's tricks (none, or the base's) would pair it with a treatment as a "contrast"
    treatments = [v for v in sweep.variants if v.kind != "control"]
    sweep.contrasts = infer_contrasts(treatments)
    references = inferred_references(treatments, sweep.contrasts)
    sweep.variants = [replace(v, reference=references[v.name]) if v.name in references else v
                      for v in sweep.variants]
    return sweep


def _one_sweep_only(sweep_dir: Path, dirs: list[Path], runs: list[Run]) -> None:
    """Run dirs gathered without a manifest come from one sweep: two sweeps' runs of one variant and
    seed would be averaged as one (a seed counted twice), and their contrasts unpaired."""
    ids = {}
    for d in dirs:
        config = _read_yaml(d / "config.yaml", []) if (d / "config.yaml").exists() else {}
        sweep_id = nested_value(config, "sweep", "id")
        if sweep_id is not None:
            ids.setdefault(str(sweep_id), d.name)
    if len(ids) > 1:
        named = ", ".join(f"{i} ({d})" for i, d in list(ids.items())[:3])
        raise ReportError(f"{sweep_dir} holds the runs of {len(ids)} sweeps ({named}); report each sweep's dir "
                          "on its own")
    seen: dict = {}
    for d, run in zip(dirs, runs):
        key = (run.variant, run.seed)
        if run.seed is not None and key in seen:
            raise ReportError(f"{sweep_dir}: {seen[key]} and {d.name} are both variant {run.variant} seed "
                              f"{run.seed}; one run each (report each sweep's dir on its own)")
        seen[key] = d.name


# --------------------------------------------------------------------------- controls and contrasts
def _control_role(variant: Variant, runs: list[Run]) -> str | None:
    """What a variant's runs say it controls for: config.yaml's `control.name` (none = a GRPO
    run), else a `control=X` override in the manifest, else None."""
    for r in runs:
        name = nested_value(r.config, "control", "name")
        if name is not None:
            return None if str(name).lower() in ("none", "null", "") else str(name)
    for o in variant.overrides:
        key, _, value = o.lstrip("+~").partition("=")
        if key == "control" and value and value.lower() != "none":
            return value
    return None


def _declared_roles(sweep: Sweep, declared) -> dict[str, str]:
    """variant name -> role from the manifest's top-level `controls` map (bad entries are notes)."""
    names = {v.name for v in sweep.variants}
    declared_role = {}
    if declared is not None and not isinstance(declared, dict):
        sweep.notes.append("manifest.json `controls` is not an object: ignored")
    for role, name in (declared or {}).items() if isinstance(declared, dict) else ():
        if name is None:
            continue
        copies = [n for n in names if n.startswith(f"{name}@")]   # a sweep across contexts: one per context
        if str(name) not in names and not copies:
            sweep.notes.append(f"manifest.json names {name!r} as the {role} control, but the sweep has no such variant")
            continue
        for each in [str(name)] if str(name) in names else copies:
            declared_role.setdefault(each, str(role))
    return declared_role


def identify_controls(sweep: Sweep, declared, by_name: bool) -> None:
    """Mark the control variants (kind `control`, with their role) and fill `sweep.controls`.
    A variant is a control when the manifest says so (its `kind`, or the top-level `controls`
    map), when its runs' config.yaml has `control.name` other than none, or, with `by_name`
    (no manifest to go by), when it is named `control-*`. Controls are listed after the
    treatments (base, sft, rft), lose any reference, and take part in no trick contrast."""
    declared_role = _declared_roles(sweep, declared)
    for i, v in enumerate(sweep.variants):
        runs = [r for r in sweep.runs if r.variant == v.name]
        config_role = _control_role(v, runs)
        named = by_name and (v.name == "control" or v.name.startswith("control-"))
        if not (v.kind == "control" or v.name in declared_role or config_role or named):
            continue
        role = declared_role.get(v.name) or config_role
        if role is None and v.name.startswith("control-"):
            role = v.name[len("control-"):]
        v = sweep.variants[i] = replace(v, kind="control", control=role, reference=None)
        if v.context and role in CONTROL_ROLES:   # one control of each role per context
            sweep.context_controls.setdefault(v.context, {})[role] = v.name
            sweep.controls[role] = f"{CONTROL_NAMES[role]}@<context>"
        elif role in sweep.controls and sweep.controls[role] != v.name:
            sweep.notes.append(f"two {role} controls ({sweep.controls[role]}, {v.name}): "
                               f"the Δ vs {role} column uses {sweep.controls[role]}")
        elif role in CONTROL_ROLES:
            sweep.controls[role] = v.name
        else:
            sweep.notes.append(f"control {v.name}: role {role!r} is not one of {', '.join(CONTROL_ROLES)}; "
                               "shown as a row, with no Δ column")
    # the roles in their fixed order, so the columns and the rows come out the same every time
    sweep.controls = {role: sweep.controls[role] for role in CONTROL_ROLES if role in sweep.controls}
    order = {name: i for i, name in enumerate(sweep.controls.values())}
    order.update({name: i for by_role in sweep.context_controls.values()
                  for i, name in enumerate(by_role[r] for r in CONTROL_ROLES if r in by_role)})
    sweep.variants.sort(key=lambda v: (v.kind == "control", order.get(v.name, len(order))))
    controls = {v.name for v in sweep.variants if v.kind == "control"}
    dropped = [c for c in sweep.contrasts if c.with_ in controls or c.without in controls]
    if dropped:
        sweep.notes.append("contrasts with a control left out of the trick verdicts: "
                           + ", ".join(f"{c.trick} ({c.with_} vs {c.without})" for c in dropped))
        sweep.contrasts = [c for c in sweep.contrasts if c not in dropped]


def infer_contrasts(variants: list[Variant]) -> list[Contrast]:
    """Without a manifest: a trick's contrast is any pair of variants whose tricks differ by
    exactly that trick."""
    by_tricks = {frozenset(v.tricks_on): v.name for v in variants}
    contrasts = []
    for v in variants:
        on = frozenset(v.tricks_on)
        for trick in sorted(on):
            without = by_tricks.get(on - {trick})
            if without is not None:
                contrasts.append(Contrast(trick, v.name, without))
    return contrasts


def inferred_references(variants: list[Variant], contrasts: list[Contrast]) -> dict[str, str | None]:
    """Without a manifest: variant name -> its reference, the one-more-trick partner where the
    sweep has an all-on variant `all` that the others drop a trick from (drop-x vs all), the
    one-fewer-trick partner otherwise (add-one-in, ladder), none where that is ambiguous (factorial)."""
    toward_all = "all" in {v.name for v in variants}   # the sweep command's name for the all-on variant
    references = {}
    for v in variants:
        if toward_all:
            partners = [c.with_ for c in contrasts if c.without == v.name]
        else:
            partners = [c.without for c in contrasts if c.with_ == v.name]
        references[v.name] = partners[0] if len(partners) == 1 else None
    return references
