"""`grpo-ablate report`: which tricks matter — the table, verdicts, health flags, pictures.

Reads only files: the sweep's `manifest.json` and, per run dir, `metrics.jsonl`,
`samples.jsonl`, `status.json` and `config.yaml`. No torch, no network, no W&B unless asked,
so it works on a laptop that holds nothing but a copied sweep dir.

Statistics are over seeds: a run's final metric is the last value it logged, a variant's is
the mean over its *completed* runs with a 95% t-interval; a trick's effect is
Δ = metric(with) − metric(without), paired by seed when both sides have the same seeds,
otherwise Welch's interval. Diverged runs are not averaged in (their last value predates the
blow-up); they are counted, flagged, drawn, and decide the *breaks training* verdict.
Control runs (the untrained base, the SFT control) are rows and reference curves, and every
variant's Δ against each is given the same way; they take part in no trick verdict.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from grpo_ablate.rundir import read_jsonl
from grpo_ablate.wandb_auth import wandb_api_key

FINISHED = ("completed", "diverged", "failed", "interrupted")   # interrupted: waits for --resume
# Flags that mean training broke. kl_drift is a warning only: a policy may legitimately move
# far from its start, and a variant without a KL term is free to.
BREAKING_FLAGS = ("diverged", "entropy_collapse", "length_blowup", "repetition")
CURVES = ("reward/mean", "length/mean", "policy/entropy", "kl")  # drawn after the chosen metric
VERDICT_COLORS = {"helps": "tab:green", "hurts": "tab:red", "no evidence": "tab:gray",
                  "breaks training": "black", "no verdict": "lightgray"}
# Control runs (issue 8): `base` is the starting policy never trained, `sft` the same budget
# spent on supervised training. Each gets a "Δ vs" column when the sweep has it.
CONTROL_ROLES = ("base", "sft")
CONTROL_LABELS = {"base": "the untrained base", "sft": "the SFT control"}
CONTROL_COLUMNS = {"base": "Δ vs base", "sft": "Δ vs SFT control"}
CONTROL_STYLES = {"base": ("dimgray", "--"), "sft": ("black", "-.")}   # (colour, dashes) of its curve


class ReportError(Exception):
    """Bad input; the CLI prints it as one `error:` line and exits 2."""


@dataclass
class HealthThresholds:
    """When a run's health flag fires. Override with `--threshold name=value`."""
    entropy_collapse_frac: float = 0.1     # policy/entropy below this fraction of its first value
    patience: int = 3                      # ... for this many consecutive logged steps (length_blowup too)
    length_cap_frac: float = 0.95          # length/mean at or above this fraction of rollout.max_new_tokens
    truncated_frac: float = 0.5            # or length/truncated_frac above this
    repetition_distinct_frac: float = 0.5  # distinct-2 inside completions below this fraction of its first value
    repetition_same_frac: float = 0.75     # or one completion given for this share of >= 3 different prompts
    kl_drift_threshold: float = 0.1        # KL above this from some step to the end (patience steps at least), ending higher


@dataclass
class Flag:
    name: str      # diverged | entropy_collapse | length_blowup | repetition | kl_drift
    step: int      # the step it first fired
    detail: str    # the numbers behind it


@dataclass
class Estimate:
    """A mean (or a difference of means) with its 95% interval; low/high None without one."""
    mean: float | None = None
    low: float | None = None
    high: float | None = None
    n: int = 0
    basis: str = "no data"

    @property
    def has_ci(self) -> bool:
        return self.low is not None and self.high is not None


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
    flags: list = field(default_factory=list)

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
    variants: list = field(default_factory=list)    # {name, tricks_on, reference, kind, control}
    contrasts: list = field(default_factory=list)   # {trick, with, without}
    runs: list = field(default_factory=list)
    wandb_group: str | None = None
    manifest_found: bool = True
    notes: list = field(default_factory=list)
    controls: dict = field(default_factory=dict)    # role (base | sft) -> control variant name


@dataclass
class Report:
    sweep: Sweep
    metric: str
    higher_is_better: bool
    thresholds: HealthThresholds
    rows: list        # one dict per variant
    verdicts: list    # one dict per contrast
    against_controls: list = field(default_factory=list)   # one dict per treatment and control

    @property
    def controls(self) -> dict:
        """role -> control variant name, for the controls this sweep has."""
        return self.sweep.controls
    diagnostics: dict = field(default_factory=dict)   # report_diagnostics.analyse: conflicts, interactions

    @property
    def finished(self) -> bool:
        return bool(self.sweep.runs) and all(r.state in FINISHED for r in self.sweep.runs)


# --------------------------------------------------------------------------- reading files
def metrics_frame(rows: list[dict]) -> pd.DataFrame:
    """One row per step (the last one written wins), numeric columns, nulls as NaN."""
    rows = [r for r in rows if isinstance(r.get("step"), (int, float))]
    if not rows:
        return pd.DataFrame({"step": pd.Series([], dtype="int64")})
    df = pd.DataFrame(rows)
    df = df.apply(lambda col: pd.to_numeric(col, errors="coerce"))
    df["step"] = df["step"].astype("int64")
    return df.drop_duplicates("step", keep="last").sort_values("step").reset_index(drop=True)


def _read_yaml(path: Path, notes: list) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, yaml.YAMLError) as err:
        notes.append(f"config.yaml unreadable ({type(err).__name__})")
        return {}


def _dig(data: dict, *keys):
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def load_run(run_dir: Path, variant: str, seed: int | None, thresholds: HealthThresholds) -> Run:
    """One run dir as the report sees it; never raises for missing or damaged files."""
    run = Run(variant=variant, seed=seed, run_dir=Path(run_dir))
    if not run.run_dir.is_dir():
        run.notes.append("not started (no run dir)")
        return run
    if (run.run_dir / "config.yaml").exists():
        run.config = _read_yaml(run.run_dir / "config.yaml", run.notes)
        tokens = _dig(run.config, "rollout", "max_new_tokens")
        run.max_new_tokens = int(tokens) if isinstance(tokens, (int, float)) else None
        if run.seed is None and isinstance(run.config.get("seed"), int):
            run.seed = run.config["seed"]
    else:
        run.notes.append("no config.yaml")

    status = None
    try:
        status = json.loads((run.run_dir / "status.json").read_text())
        if not isinstance(status, dict):
            raise ValueError("not an object")
    except FileNotFoundError:
        run.notes.append("no status.json")
    except (OSError, ValueError) as err:
        run.notes.append(f"status.json unreadable ({type(err).__name__})")
        status = None

    if (run.run_dir / "metrics.jsonl").exists():
        rows, problems = read_jsonl(run.run_dir / "metrics.jsonl")
        run.notes += [f"metrics.jsonl: {p}" for p in problems]
        run.metrics = metrics_frame(rows)
        if run.metrics.empty:
            run.notes.append("metrics.jsonl is empty")
    elif status is None or status.get("state") != "running":
        run.notes.append("no metrics.jsonl")
    if (run.run_dir / "samples.jsonl").exists():
        run.samples, _ = read_jsonl(run.run_dir / "samples.jsonl")

    if status is not None:
        run.state = str(status.get("state") or "missing")
        run.step, run.reason = status.get("step"), status.get("reason")
        run.wall_time_s = status.get("wall_time_s")
        # status.json says finished but there is nothing to read: as good as missing
        if run.metrics.empty and run.state != "running":
            run.notes.append(f"status.json says {run.state}, but there are no metrics")
            run.state = "missing"
    run.flags = health_flags(run.metrics, run.samples, run.max_new_tokens, thresholds, status)
    return run


def load_sweep(sweep_dir: Path, thresholds: HealthThresholds | None = None) -> Sweep:
    """The sweep from its manifest, or, without one, from the run dirs found in it."""
    thresholds = thresholds or HealthThresholds()
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise ReportError(f"{sweep_dir}: no such directory")
    manifest, note = None, None
    path = sweep_dir / "manifest.json"
    if path.exists():
        try:
            manifest = json.loads(path.read_text())
            if not isinstance(manifest, dict):
                raise ValueError("not an object")
        except (OSError, ValueError) as err:
            manifest, note = None, f"manifest.json is unreadable ({type(err).__name__}): grouped the run dirs found instead"
    else:
        note = "manifest.json is missing: grouped the run dirs found by their config (sweep.variant, else run.job_type)"
    if manifest is None:
        sweep = _scan_sweep(sweep_dir, thresholds)
        sweep.notes.insert(0, note)
        return sweep

    sweep = Sweep(dir=sweep_dir, name=str(manifest.get("name") or sweep_dir.name),
                  sweep_id=manifest.get("sweep_id"), mode=manifest.get("mode"), base=manifest.get("base"),
                  seeds=list(manifest.get("seeds") or []), wandb_group=manifest.get("wandb_group"))
    if manifest.get("version", 1) != 1:
        sweep.notes.append(f"manifest version {manifest.get('version')!r}; read as version 1")
    for v in manifest.get("variants") or []:
        if isinstance(v, dict) and v.get("name"):
            sweep.variants.append({"name": str(v["name"]), "tricks_on": list(v.get("tricks_on") or []),
                                   "reference": v.get("reference"), "kind": v.get("kind") or "treatment",
                                   "overrides": [str(o) for o in v.get("overrides") or []]})
    sweep.contrasts = [c for c in manifest.get("contrasts") or []
                       if isinstance(c, dict) and {"trick", "with", "without"} <= c.keys()]
    entries = manifest.get("runs")
    if not isinstance(entries, list):  # a manifest without its run list: the matrix says what to expect
        sweep.notes.append("manifest.json lists no runs: expected <variant>-s<seed> for every variant and seed")
        entries = [{"variant": v["name"], "seed": s} for v in sweep.variants for s in sweep.seeds]
    known = {v["name"] for v in sweep.variants}
    for entry in entries:
        if not isinstance(entry, dict) or not entry.get("variant"):
            continue
        variant, seed = str(entry["variant"]), entry.get("seed")
        if variant not in known:
            known.add(variant)
            sweep.variants.append({"name": variant, "tricks_on": [], "reference": None, "kind": "treatment"})
        run_dir = sweep_dir / str(entry.get("run_dir") or f"{variant}-s{seed}")
        sweep.runs.append(load_run(run_dir, variant, seed, thresholds))
    identify_controls(sweep, manifest.get("controls"), by_name=False)
    return sweep


def _scan_sweep(sweep_dir: Path, thresholds: HealthThresholds) -> Sweep:
    """No manifest: every subdir with a config.yaml, status.json or metrics.jsonl is a run."""
    dirs = [d for d in sorted(sweep_dir.iterdir()) if d.is_dir() and any(
        (d / f).exists() for f in ("config.yaml", "status.json", "metrics.jsonl"))]
    if not dirs:
        raise ReportError(f"{sweep_dir}: no manifest.json and no run dirs in it "
                          "(subdirectories with config.yaml, status.json or metrics.jsonl)")
    sweep = Sweep(dir=sweep_dir, name=sweep_dir.name, manifest_found=False)
    variants: dict[str, dict] = {}
    for d in dirs:
        config = _read_yaml(d / "config.yaml", []) if (d / "config.yaml").exists() else {}
        variant = str(_dig(config, "sweep", "variant") or _dig(config, "run", "job_type") or d.name)
        seed = config.get("seed") if isinstance(config.get("seed"), int) else None
        sweep.runs.append(load_run(d, variant, seed, thresholds))
        tricks = config.get("tricks") if isinstance(config.get("tricks"), dict) else {}
        variants.setdefault(variant, {"name": variant, "tricks_on": sorted(tricks), "reference": None,
                                      "kind": "treatment"})
        sweep.name = str(_dig(config, "sweep", "name") or sweep.name)
        sweep.sweep_id = _dig(config, "sweep", "id") or sweep.sweep_id
        sweep.mode = _dig(config, "sweep", "mode") or sweep.mode
        sweep.wandb_group = _dig(config, "run", "group") or sweep.wandb_group
    sweep.variants = list(variants.values())
    sweep.seeds = sorted({r.seed for r in sweep.runs if r.seed is not None})
    identify_controls(sweep, None, by_name=True)
    # a control's tricks (none, or the base's) would pair it with a treatment as a "contrast"
    sweep.contrasts = infer_contrasts([v for v in sweep.variants if v["kind"] != "control"], sweep.mode)
    return sweep


def _control_role(variant: dict, runs: list[Run]) -> str | None:
    """What a variant's runs say it controls for: config.yaml's `control.name` (none = a GRPO
    run), else a `control=X` override in the manifest, else None."""
    for r in runs:
        name = _dig(r.config, "control", "name")
        if name is not None:
            return None if str(name).lower() in ("none", "null", "") else str(name)
    for o in variant.get("overrides") or []:
        key, _, value = o.lstrip("+~").partition("=")
        if key == "control" and value and value.lower() != "none":
            return value
    return None


def identify_controls(sweep: Sweep, declared, by_name: bool) -> None:
    """Mark the control variants (kind `control`, with their role) and fill `sweep.controls`.
    A variant is a control when the manifest says so (its `kind`, or the top-level `controls`
    map), when its runs' config.yaml has `control.name` other than none, or, with `by_name`
    (no manifest to go by), when it is named `control-*`. Controls are listed after the
    treatments (base, then sft), lose any reference, and take part in no trick contrast."""
    names = {v["name"] for v in sweep.variants}
    declared_role = {}
    if declared is not None and not isinstance(declared, dict):
        sweep.notes.append("manifest.json `controls` is not an object: ignored")
    for role, name in (declared or {}).items() if isinstance(declared, dict) else ():
        if name is None:
            continue
        if str(name) not in names:
            sweep.notes.append(f"manifest.json names {name!r} as the {role} control, but the sweep has no such variant")
            continue
        declared_role.setdefault(str(name), str(role))
    for v in sweep.variants:
        runs = [r for r in sweep.runs if r.variant == v["name"]]
        config_role = _control_role(v, runs)
        named = by_name and (v["name"] == "control" or v["name"].startswith("control-"))
        if not (v["kind"] == "control" or v["name"] in declared_role or config_role or named):
            continue
        role = declared_role.get(v["name"]) or config_role
        if role is None and v["name"].startswith("control-"):
            role = v["name"][len("control-"):]
        v.update(kind="control", control=role, reference=None)
        if role in sweep.controls and sweep.controls[role] != v["name"]:
            sweep.notes.append(f"two {role} controls ({sweep.controls[role]}, {v['name']}): "
                               f"the Δ vs {role} column uses {sweep.controls[role]}")
        elif role in CONTROL_ROLES:
            sweep.controls[role] = v["name"]
        else:
            sweep.notes.append(f"control {v['name']}: role {role!r} is not one of {', '.join(CONTROL_ROLES)}; "
                               "shown as a row, with no Δ column")
    # the roles in their fixed order, so the columns and the rows come out the same every time
    sweep.controls = {role: sweep.controls[role] for role in CONTROL_ROLES if role in sweep.controls}
    order = {name: i for i, name in enumerate(sweep.controls.values())}
    sweep.variants.sort(key=lambda v: (v["kind"] == "control", order.get(v["name"], len(order))))
    controls = {v["name"] for v in sweep.variants if v["kind"] == "control"}
    dropped = [c for c in sweep.contrasts if c["with"] in controls or c["without"] in controls]
    if dropped:
        sweep.notes.append("contrasts with a control left out of the trick verdicts: "
                           + ", ".join(f"{c['trick']} ({c['with']} vs {c['without']})" for c in dropped))
        sweep.contrasts = [c for c in sweep.contrasts if c not in dropped]


def infer_contrasts(variants: list[dict], mode: str | None) -> list[dict]:
    """Without a manifest: a trick's contrast is any pair of variants whose tricks differ by
    exactly that trick. Sets each variant's reference: the one-more-trick partner for
    leave-one-out (drop-x vs all), the one-fewer-trick partner otherwise (add-one-in, ladder),
    none where that is ambiguous (factorial). With no mode recorded, a variant named `all`
    means leave-one-out."""
    by_tricks = {frozenset(v["tricks_on"]): v["name"] for v in variants}
    contrasts = []
    for v in variants:
        on = frozenset(v["tricks_on"])
        for trick in sorted(on):
            without = by_tricks.get(on - {trick})
            if without is not None:
                contrasts.append({"trick": trick, "with": v["name"], "without": without})
    if mode is None and "all" in {v["name"] for v in variants}:
        mode = "leave-one-out"   # the sweep command's name for the all-on variant
    for v in variants:
        if mode == "leave-one-out":
            partners = [c["with"] for c in contrasts if c["without"] == v["name"]]
        else:
            partners = [c["without"] for c in contrasts if c["with"] == v["name"]]
        v["reference"] = partners[0] if len(partners) == 1 else None
    return contrasts


# --------------------------------------------------------------------------- statistics
def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b), by its continued fraction (Numerical Recipes 6.4)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for aa in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def t_quantile(p: float, df: float) -> float:
    """Student-t quantile for p in (0.5, 1) and any df > 0 (Welch's df is fractional), by
    bisection on P(|T| > t) = I_{df/(df+t²)}(df/2, 1/2). Saves a scipy dependency."""
    tail = 2.0 * (1.0 - p)
    upper_tail = lambda t: _betainc(df / 2.0, 0.5, df / (df + t * t))
    lo, hi = 0.0, 1.0
    while upper_tail(hi) > tail:
        hi *= 2.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if upper_tail(mid) > tail else (lo, mid)
    return (lo + hi) / 2.0


def mean_ci(values, level: float = 0.95) -> Estimate:
    """Mean with a t-interval over seeds; one value gives the mean and no interval."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(x) == 0:
        return Estimate()
    if len(x) == 1:
        return Estimate(float(x[0]), None, None, 1, "n=1, no CI")
    half = t_quantile(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return Estimate(float(x.mean()), float(x.mean() - half), float(x.mean() + half), len(x), f"t-interval, n={len(x)}")


def delta_ci(treated: dict, reference: dict, level: float = 0.95) -> Estimate:
    """Δ = mean(treated) − mean(reference), values keyed by seed: paired over seeds when both
    sides have the same seeds, otherwise Welch's interval (each side needs n >= 2)."""
    treated = {k: v for k, v in treated.items() if v is not None and math.isfinite(v)}
    reference = {k: v for k, v in reference.items() if v is not None and math.isfinite(v)}
    if not treated or not reference:
        return Estimate()
    if treated.keys() == reference.keys():
        seeds = sorted(treated, key=str)
        est = mean_ci([treated[s] - reference[s] for s in seeds], level)
        est.basis = f"paired over seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
        return est
    a, b = np.array(list(treated.values())), np.array(list(reference.values()))
    diff = float(a.mean() - b.mean())
    basis = f"Welch, n={len(a)} vs {len(b)} (seeds differ)"
    if len(a) < 2 or len(b) < 2:
        return Estimate(diff, None, None, min(len(a), len(b)), basis + ", no CI")
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Estimate(diff, diff, diff, min(len(a), len(b)), basis)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(0.5 + level / 2, df) * se
    return Estimate(diff, diff - half, diff + half, min(len(a), len(b)), basis)


def final_value(metrics: pd.DataFrame, column: str) -> float | None:
    """The last value a run logged for this column."""
    if column not in metrics:
        return None
    values = metrics[column].dropna()
    return float(values.iloc[-1]) if len(values) else None


def curve_mean(metrics: pd.DataFrame, column: str) -> float | None:
    """Area under the curve over its step range (trapezoid), i.e. the metric's mean over
    training: less noisy than the last point."""
    if column not in metrics:
        return None
    points = metrics[["step", column]].dropna()
    if len(points) < 2:
        return float(points[column].iloc[0]) if len(points) else None
    steps, values = points["step"].to_numpy(float), points[column].to_numpy(float)
    return float(np.sum((values[1:] + values[:-1]) / 2 * np.diff(steps)) / (steps[-1] - steps[0]))


def kl_column(metrics: pd.DataFrame) -> str | None:
    """k3 when logged (the estimator the KL term usually uses), else k1."""
    for column in ("kl/k3", "kl/k1"):
        if column in metrics and metrics[column].notna().any():
            return column
    return None


# --------------------------------------------------------------------------- health flags
def health_flags(metrics: pd.DataFrame, samples: list[dict], max_new_tokens: int | None,
                 thresholds: HealthThresholds | None = None, status: dict | None = None) -> list[Flag]:
    """What went wrong in one run, each with the step it first fired. Pure: metrics as read
    by `metrics_frame`, samples as rows of samples.jsonl, status as status.json (optional)."""
    th = thresholds or HealthThresholds()
    train = metrics[metrics["step"] > 0] if "step" in metrics else metrics.iloc[0:0]
    flags = []

    # diverged: the trainer said so, or a training step's loss is null (NaN/Inf is written as null)
    candidates = []
    if status and status.get("state") == "diverged":
        candidates.append((int(status.get("step") or 0), status.get("reason") or "status.json says diverged"))
    if "loss" in train and len(train):
        bad = train.loc[~np.isfinite(train["loss"].to_numpy(float)), "step"]
        if len(bad):
            candidates.append((int(bad.iloc[0]), f"loss non-finite at {len(bad)} of {len(train)} steps"))
    if candidates:
        step, detail = min(candidates, key=lambda c: c[0])
        flags.append(Flag("diverged", step, detail))

    # entropy_collapse: policy entropy far below where it started, for a while
    if "policy/entropy" in train:
        entropy = train[["step", "policy/entropy"]].dropna()
        if len(entropy) and entropy["policy/entropy"].iloc[0] > 0:
            first = float(entropy["policy/entropy"].iloc[0])
            low = entropy["policy/entropy"] < th.entropy_collapse_frac * first
            step = _first_streak(entropy["step"], low, th.patience)
            if step is not None:
                value = float(entropy.loc[entropy["step"] == step, "policy/entropy"].iloc[0])
                flags.append(Flag("entropy_collapse", step,
                                  f"policy/entropy {value:.3g} < {th.entropy_collapse_frac} x its first value "
                                  f"{first:.3g} for {th.patience}+ steps"))

    # length_blowup: completions running into the cap
    steps = train["step"]
    at_cap = pd.Series(False, index=train.index)
    if max_new_tokens and "length/mean" in train:
        at_cap = train["length/mean"] >= th.length_cap_frac * max_new_tokens
    truncated = train["length/truncated_frac"] > th.truncated_frac if "length/truncated_frac" in train \
        else pd.Series(False, index=train.index)
    step = _first_streak(steps, at_cap | truncated, th.patience)
    if step is not None:
        row = train.loc[train["step"] == step].iloc[0]
        detail = (f"length/mean {row['length/mean']:.1f} >= {th.length_cap_frac} x max_new_tokens {max_new_tokens}"
                  if at_cap[row.name] else
                  f"length/truncated_frac {row['length/truncated_frac']:.2f} > {th.truncated_frac}")
        flags.append(Flag("length_blowup", step, detail + f" for {th.patience}+ steps"))

    repetition = _repetition(samples, th)
    if repetition is not None:
        flags.append(repetition)

    # kl_drift: KL above the threshold from some step to the end and higher at the end
    column = kl_column(train)
    if column is not None:
        kl = train[["step", column]].dropna()
        above = (kl[column] > th.kl_drift_threshold).to_numpy()
        if len(above) and above[-1]:
            start = len(above) - int(np.argmin(above[::-1])) if not above.all() else 0
            first, last = float(kl[column].iloc[start]), float(kl[column].iloc[-1])
            if len(above) - start >= th.patience and last >= first:
                flags.append(Flag("kl_drift", int(kl["step"].iloc[start]),
                                  f"{column} above {th.kl_drift_threshold} from here to the end "
                                  f"({first:.3g} -> {last:.3g})"))
    return sorted(flags, key=lambda f: f.step)


def _first_streak(steps: pd.Series, condition: pd.Series, patience: int) -> int | None:
    """First step of the first run of `patience` consecutive rows where condition holds."""
    streak = 0
    steps = list(steps)
    for i, hit in enumerate(condition.fillna(False).astype(bool)):
        streak = streak + 1 if hit else 0
        if streak >= max(1, patience):
            return int(steps[i - streak + 1])
    return None


def distinct_2(completions: list[str]) -> float | None:
    """Mean share of distinct character bigrams inside each completion (a repeater's
    "ab ab ab ab" scores low). Characters, not tokens: no tokenizer is needed, and the
    flag compares the value with the run's own first one, so the unit cancels out."""
    scores = []
    for text in completions:
        bigrams = [text[i:i + 2] for i in range(len(text) - 1)]
        if len(bigrams) >= 2:
            scores.append(len(set(bigrams)) / len(bigrams))
    return float(np.mean(scores)) if scores else None


def _repetition(samples: list[dict], th: HealthThresholds) -> Flag | None:
    by_step: dict[int, list[dict]] = {}
    for row in samples:
        if isinstance(row.get("step"), int) and isinstance(row.get("completion"), str):
            by_step.setdefault(row["step"], []).append(row)
    first, first_step = None, None
    for step in sorted(by_step):
        rows = by_step[step]
        value = distinct_2([r["completion"] for r in rows])
        if first is None and value is not None:
            first, first_step = value, step
        elif value is not None and first > 0 and value < th.repetition_distinct_frac * first:
            return Flag("repetition", step, f"distinct-2 inside completions {value:.2f} < "
                        f"{th.repetition_distinct_frac} x {first:.2f} (step {first_step})")
        # the same text whatever the question: only testable when the samples span >= 3 prompts
        prompts_per_text: dict[str, set] = {}
        for r in rows:
            prompts_per_text.setdefault(r["completion"], set()).add(r.get("prompt"))
        n_prompts = len({r.get("prompt") for r in rows})
        text, prompts = max(prompts_per_text.items(), key=lambda kv: len(kv[1]))
        if n_prompts >= 3 and len(prompts) >= th.repetition_same_frac * n_prompts:
            return Flag("repetition", step, f"the same completion {text[:40]!r} for {len(prompts)} of "
                        f"{n_prompts} different prompts")
    return None


# --------------------------------------------------------------------------- the report
def normalize_metric(name: str) -> str:
    """`eval_accuracy` means `eval/accuracy` (metric prefixes have no underscores)."""
    return name if "/" in name or "_" not in name else name.replace("_", "/", 1)


def build_report(sweep_dir: Path, metric: str = "eval/accuracy", thresholds: HealthThresholds | None = None,
                 higher_is_better: bool = True, conflict_threshold: float = -0.1) -> Report:
    """Everything the table, verdicts and pictures say, computed once. Raises ReportError
    for a missing dir or a metric that no run logged."""
    thresholds = thresholds or HealthThresholds()
    sweep = load_sweep(sweep_dir, thresholds)
    metric = normalize_metric(metric)
    logged = set().union(*(r.metrics.columns for r in sweep.runs)) - {"step"} if sweep.runs else set()
    if logged and metric not in logged:
        raise ReportError(f"metric {metric!r} is in no run's metrics.jsonl; logged: "
                          f"{', '.join(sorted(c for c in logged if c.startswith(('eval/', 'reward/', 'train/'))))}, ...")

    runs_of = {v["name"]: [r for r in sweep.runs if r.variant == v["name"]] for v in sweep.variants}
    finals = {name: {r.key: final_value(r.metrics, metric) for r in runs if r.state == "completed"}
              for name, runs in runs_of.items()}
    areas = {name: {r.key: curve_mean(r.metrics, metric) for r in runs if r.state == "completed"}
             for name, runs in runs_of.items()}
    rows = []
    for v in sweep.variants:
        runs = runs_of[v["name"]]
        done = [r for r in runs if r.state == "completed"]
        reference = v.get("reference") if v.get("reference") in runs_of else None
        rows.append({
            "variant": v["name"], "kind": v.get("kind", "treatment"), "tricks_on": v["tricks_on"],
            "reference": reference,
            "seeds": sorted({r.seed for r in runs if r.state != "missing" and r.seed is not None}),
            "status": Counter(r.state for r in runs),
            "diverged_steps": [r.step for r in runs if r.state == "diverged"],
            "running_steps": [r.step for r in runs if r.state == "running"],
            "final": mean_ci(finals[v["name"]].values()),
            "auc": mean_ci(areas[v["name"]].values()),
            "delta": delta_ci(finals[v["name"]], finals[reference]) if reference else None,
            "length": _mean([final_value(r.metrics, "length/mean") for r in done]),
            "truncated": _mean([final_value(r.metrics, "length/truncated_frac") for r in done]),
            "entropy": _mean([final_value(r.metrics, "policy/entropy") for r in done]),
            "kl": _mean([final_value(r.metrics, kl_column(r.metrics)) for r in done if kl_column(r.metrics)]),
            "wall_time_s": _mean([r.wall_time_s for r in done]),
            "flags": Counter(f.name for r in runs for f in r.flags),
        })
        if v["kind"] == "control":
            rows[-1]["control"] = v.get("control")
            rows[-1]["budget"] = next((str(b) for r in runs if (b := _dig(r.config, "control", "budget"))), None)
        # the controls' columns: only when the sweep has them, so a sweep without is unchanged
        for role, control in sweep.controls.items():
            rows[-1][f"delta_vs_{role}"] = None if control == v["name"] else delta_ci(finals[v["name"]], finals[control])

    against = []
    for v in sweep.variants:
        if v["kind"] == "control":
            continue
        for role, control in sweep.controls.items():
            delta = delta_ci(finals[v["name"]], finals[control])
            outcome, beats, why = compare_with_control(delta, finals[control], higher_is_better)
            against.append({"variant": v["name"], "control": control, "role": role, "delta": delta,
                            "outcome": outcome, "beats": beats, "why": why})
            row = next(r for r in rows if r["variant"] == v["name"])
            row[f"beats_{role}"] = beats

    verdicts = []
    for c in sweep.contrasts:
        if c["with"] not in runs_of or c["without"] not in runs_of:
            verdicts.append({**c, "verdict": "no verdict", "delta": Estimate(), "auc_delta": Estimate(),
                             "why": "a variant of this contrast is not in the sweep"})
            continue
        delta = delta_ci(finals[c["with"]], finals[c["without"]])
        verdict, why = decide(runs_of[c["with"]], runs_of[c["without"]], delta, higher_is_better)
        verdicts.append({**c, "verdict": verdict, "delta": delta,
                         "auc_delta": delta_ci(areas[c["with"]], areas[c["without"]]), "why": why})
    report = Report(sweep, metric, higher_is_better, thresholds, rows, verdicts, against)
    from grpo_ablate.report import diagnostics as report_diagnostics   # gradient conflicts, interactions, conflict checks
    report.diagnostics = report_diagnostics.analyse(report, conflict_threshold)
    return report


def compare_with_control(delta: Estimate, control: dict, higher_is_better: bool) -> tuple[str, bool | None, str]:
    """Whether a variant beats a control (Δ = variant − control; `control` is the control's
    final values keyed by seed): (outcome, beats, why).
    outcome: *beats* only when the 95% CI of Δ lies entirely on the better side of zero;
    *not shown* when it does not, or when no interval is possible (one seed, too few runs, no
    completed run of the variant): it has not shown that it beats the control; *no comparison*
    when the control itself has nothing to compare with (then no claim is made either way).
    beats: True / False when an interval decided, None when none could."""
    if not any(v is not None for v in control.values()):
        return "no comparison", None, ("the control has no completed run" if not control
                                       else "the control's runs did not log this metric")
    if delta.mean is None:
        return "not shown", None, "no completed run of this variant to compare"
    if not delta.has_ci:
        if delta.n <= 1 and "Welch" not in delta.basis:
            return "not shown", None, "one seed: no comparison is possible beyond the point estimate"
        return "not shown", None, f"too few completed runs for an interval ({delta.basis})"
    if delta.low == delta.high and delta.low != 0.0:   # as in _decide_by_delta: a coarse metric, not certainty
        return "not shown", False, "every seed gave the same Δ: a zero-width interval says nothing about noise"
    if (delta.low > 0) if higher_is_better else (delta.high < 0):
        return "beats", True, f"the 95% CI of Δ lies entirely {'above' if higher_is_better else 'below'} zero"
    if (delta.high < 0) if higher_is_better else (delta.low > 0):
        return "not shown", False, f"it is worse: the 95% CI of Δ lies entirely {'below' if higher_is_better else 'above'} zero"
    return "not shown", False, "the 95% CI of Δ spans zero"


def decide(with_runs: list[Run], without_runs: list[Run], delta: Estimate, higher_is_better: bool) -> tuple[str, str]:
    """The verdict on one trick and why. *breaks training*: at least half of the finished
    runs with it broke (diverged or a breaking health flag) and none without it did. Else
    the CI of Δ decides; a CI that touches zero is *no evidence*, never a difference, and a
    zero-width CI (every seed gave the same Δ) decides nothing."""
    with_done = [r for r in with_runs if r.state in ("completed", "diverged")]
    without_done = [r for r in without_runs if r.state in ("completed", "diverged")]
    broke_with = [r for r in with_done if r.broken]
    broke_without = [r for r in without_done if r.broken]
    if broke_with and without_done and not broke_without and 2 * len(broke_with) >= len(with_done):
        how = "; ".join(f"{r.name}: " + ", ".join(f"{f.name}@{f.step}" for f in r.flags if f.name in BREAKING_FLAGS)
                        for r in broke_with)
        return "breaks training", (f"{len(broke_with)} of {len(with_done)} runs with it broke ({how}); "
                                   f"0 of {len(without_done)} without it")
    verdict, why = _decide_by_delta(delta, higher_is_better)
    if broke_without or broke_with:  # the numbers are only part of the story then
        why += (f" (runs that broke: {len(broke_with)} of {len(with_done)} with it, "
                f"{len(broke_without)} of {len(without_done)} without)")
    return verdict, why


def _decide_by_delta(delta: Estimate, higher_is_better: bool) -> tuple[str, str]:
    if delta.mean is None:
        return "no verdict", "no completed runs on one side to compare"
    if not delta.has_ci:
        if delta.n <= 1 and "Welch" not in delta.basis:
            return "no verdict", "one seed: only *breaks training* can be called"
        return "no verdict", f"too few completed runs for an interval ({delta.basis})"
    if delta.low <= 0.0 <= delta.high:
        return "no evidence", "the 95% CI of Δ spans zero"
    if delta.low == delta.high:  # every seed gave the same Δ: a coarse metric, not certainty
        return "no verdict", ("every seed gave the same nonzero Δ, so the interval has zero width and says "
                              "nothing about noise (a coarse metric? more eval problems or seeds)")
    better = (delta.low > 0) == higher_is_better
    return ("helps" if better else "hurts"), "the 95% CI of Δ excludes zero"


def _mean(values) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(values)) if values else None


# --------------------------------------------------------------------------- rendering
def _num(value, digits: int = 3, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _estimate_cell(est: Estimate | None, signed: bool = False) -> str:
    if est is None or est.mean is None:
        return "—"
    if not est.has_ci:
        return f"{_num(est.mean, signed=signed)} (n={est.n}, no CI)"
    cell = f"{_num(est.mean, signed=signed)} ± {(est.high - est.low) / 2:.3f}"
    return cell + (" (Welch)" if "Welch" in est.basis else "")


def _status_cell(row: dict) -> str:
    parts = []
    for state in ("completed", "diverged", "failed", "running", "missing"):
        n = row["status"].get(state, 0)
        if not n:
            continue
        if state == "diverged":
            parts.append(f"{n} diverged@{','.join(str(s) for s in row['diverged_steps'])}")
        elif state == "running":
            parts.append(f"{n} running@{','.join(str(s) for s in row['running_steps'])}")
        else:
            parts.append(f"{n} {state}")
    parts += [f"{n} {state}" for state, n in row["status"].items() if state not in
              ("completed", "diverged", "failed", "running", "missing")]
    return ", ".join(parts) or "no runs"


def variants_table(report: Report) -> str:
    m = report.metric
    header = ["variant", "tricks on", "seeds", "status", f"final {m} (95% CI)", f"AUC {m}", "Δ vs reference",
              *(CONTROL_COLUMNS[role] for role in report.controls),
              "length", "truncated", "entropy", "KL", "wall s", "flags"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in report.rows:
        name = row["variant"] + (" (control)" if row["kind"] == "control" else "")
        delta = "reference" if row["reference"] is None and any(r["reference"] == row["variant"] for r in report.rows) \
            else ("—" if row["reference"] is None or row["delta"].mean is None
                  else f"{_estimate_cell(row['delta'], signed=True)} vs {row['reference']}")
        versus = ["control" if control == row["variant"] else _estimate_cell(row[f"delta_vs_{role}"], signed=True)
                  for role, control in report.controls.items()]
        cells = [name, _tricks_cell(row), ",".join(map(str, row["seeds"])) or "—",
                 _status_cell(row), _estimate_cell(row["final"]), _estimate_cell(row["auc"]), delta, *versus,
                 _num(row["length"], 1), _num(row["truncated"], 2), _num(row["entropy"]), _num_g(row["kl"]),
                 _num(row["wall_time_s"], 1),
                 ", ".join(f"{k}×{n}" for k, n in sorted(row["flags"].items())) or "—"]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def _tricks_cell(row: dict) -> str:
    """A control has no tricks to list: say what it is instead."""
    if row["kind"] != "control":
        return ", ".join(row["tricks_on"]) or "—"
    what = {"base": "no training", "sft": "supervised on reference solutions"}.get(row.get("control"),
                                                                                 f"control {row.get('control')}")
    return what + (f", {row['budget']} budget" if row.get("budget") and row.get("control") != "base" else "")


def _num_g(value) -> str:
    return "—" if value is None else f"{value:.3g}"


def verdict_lines(report: Report) -> list[str]:
    if not report.verdicts:
        return ["No contrasts: this sweep has no pair of variants that differ by one trick."]
    lines = []
    for v in report.verdicts:
        d = v["delta"]
        numbers = ""
        if d.mean is not None:
            numbers = f"Δ {report.metric} ({v['with']} − {v['without']}) = {_num(d.mean, signed=True)}"
            if d.has_ci:
                numbers += f", 95% CI [{_num(d.low, signed=True)}, {_num(d.high, signed=True)}]"
            numbers += f", {d.basis}; "
        lines.append(f"- **{v['trick']}**: *{v['verdict']}* — {numbers}{v['why']}.")
    return lines


def _delta_numbers(report: Report, d: Estimate) -> str:
    if d.mean is None:
        return ""
    text = f"Δ = {_num(d.mean, signed=True)}"
    if d.has_ci:
        text += f", 95% CI [{_num(d.low, signed=True)}, {_num(d.high, signed=True)}], {d.basis}"
    return text


def control_lines(report: Report) -> list[str]:
    """The "Against the controls" section: for every treatment, does it beat each control?
    Not beating the SFT control is said plainly: RL is not shown to help here."""
    direction = "above" if report.higher_is_better else "below"
    lines = [f"Δ = variant − control on the final `{report.metric}`, paired by seed when both have the same "
             f"seeds, else Welch. A variant *beats* a control only when the 95% CI of Δ lies entirely {direction} zero.", ""]
    by_variant: dict[str, list] = {}
    for c in report.against_controls:
        by_variant.setdefault(c["variant"], []).append(c)
    for variant, comparisons in by_variant.items():
        parts, rl_not_shown = [], False
        for c in comparisons:
            label = CONTROL_LABELS[c["role"]]
            numbers = _delta_numbers(report, c["delta"])
            if c["outcome"] == "beats":
                parts.append(f"beats {label} ({numbers})")
            elif c["outcome"] == "not shown":
                verb = "not shown to beat the untrained base" if c["role"] == "base" else "does not beat the SFT control"
                parts.append(f"{verb} ({numbers + '; ' if numbers else ''}{c['why']})")
                rl_not_shown |= c["role"] == "sft"
            else:   # the control has nothing to compare with: no claim either way
                parts.append(f"no comparison with {label} ({c['why']})")
        line = f"- **{variant}**: " + "; ".join(parts)
        lines.append(line + (" — **RL not shown to help here**." if rl_not_shown else "."))
    base, sft = report.controls.get("base"), report.controls.get("sft")
    if base and sft:   # is the supervised budget itself worth anything?
        row = next(r for r in report.rows if r["variant"] == sft)
        numbers = _delta_numbers(report, row["delta_vs_base"])
        lines.append(f"- The SFT control itself vs the untrained base: {numbers or 'no Δ (no completed runs on a side)'}.")
    if report.against_controls and all(c["delta"].n <= 1 and not c["delta"].has_ci for c in report.against_controls):
        lines += ["", "With one seed per variant no comparison with the controls is possible beyond point estimates."]
    return lines


def controls_summary(report: Report) -> str | None:
    """One line for the top of the report when no variant beats the SFT control."""
    sft = report.controls.get("sft")
    versus_sft = [c for c in report.against_controls if c["role"] == "sft"]
    if not sft or not versus_sft or any(c["outcome"] == "beats" for c in versus_sft):
        return None
    if all(c["outcome"] == "no comparison" for c in versus_sft):
        return None   # the control itself has nothing to compare with: "Against the controls" says why
    one_seed = all(not c["delta"].has_ci for c in versus_sft)
    return (f"**No variant beats the SFT control (`{sft}`) on `{report.metric}`: RL not shown to help here.**"
            + (" (One seed: point estimates only, no comparison is possible.)" if one_seed else ""))


def runs_table(report: Report) -> str:
    lines = ["| run | variant | seed | state | step | " + f"final {report.metric} | AUC | flags | notes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report.sweep.runs:
        flags = ", ".join(f"{f.name}@{f.step}" for f in r.flags) or "—"
        notes = "; ".join(r.notes + ([f"reason: {r.reason}"] if r.reason else [])) or "—"
        cells = [r.name, r.variant, str(r.seed), r.state, str(r.step if r.step is not None else "—"),
                 _num(final_value(r.metrics, report.metric)), _num(curve_mean(r.metrics, report.metric)),
                 flags, notes]
        lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines)


def render_markdown(report: Report, figures: list[tuple[str, str]] | None = None) -> str:
    """report.md; `figures` are (title, file name next to report.md); None leaves them out."""
    s = report.sweep
    states = Counter(r.state for r in s.runs)
    title = f"# Report: {s.name}" + (f" ({s.sweep_id})" if s.sweep_id else "")
    facts = [f"mode {s.mode}" if s.mode else None, f"base {s.base}" if s.base else None,
             f"seeds {', '.join(map(str, s.seeds))}" if s.seeds else None,
             f"{len(s.runs)} runs: " + ", ".join(f"{n} {k}" for k, n in states.most_common())]
    direction = "higher" if report.higher_is_better else "lower"
    summary = controls_summary(report) if report.controls else None
    out = [title, "", *([summary, ""] if summary else []), "; ".join(f for f in facts if f) + ".", "",
           f"Metric: `{report.metric}` ({direction} is better). Final = the last value a run logged; "
           "a variant's numbers are means over its completed runs, ± the half-width of the 95% "
           "t-interval over seeds. AUC = the metric averaged over its curve (trapezoid / steps). "
           "Δ = variant − reference, paired by seed when both have the same seeds, else Welch. "
           "length, truncated, entropy, KL = last logged `length/mean`, `length/truncated_frac`, "
           "`policy/entropy`, `kl/k3` (else `kl/k1`); wall s = status.json's wall time."
           + (" Controls: " + ", ".join(f"`{name}` ({CONTROL_LABELS[role]})" for role, name in report.controls.items())
              + "; " + " and ".join(f"{CONTROL_COLUMNS[role]} = variant − `{name}`"
                                    for role, name in report.controls.items())
              + ", the same way; controls take part in no trick verdict." if report.controls else ""), ""]
    if not s.manifest_found or any(r.notes for r in s.runs) or s.notes:
        out += ["**What is missing**", ""]
        out += [f"- {n}" for n in s.notes]
        out += [f"- `{r.name}`: {'; '.join(r.notes)}" for r in s.runs if r.notes]
        out.append("")
    out += ["## Variants", "", variants_table(report), "", "## Verdicts per trick", ""]
    out += verdict_lines(report)
    if report.verdicts and all(v["delta"].n <= 1 for v in report.verdicts):
        out += ["", "With one seed per variant no verdict is possible beyond *breaks training*."]
    if report.controls:
        out += ["", "## Against the controls", ""] + control_lines(report)
    from grpo_ablate.report.diagnostics import markdown_sections
    out += [""] + markdown_sections(report)
    out += ["## Health flags", ""]
    flagged = [(r, f) for r in s.runs for f in r.flags]
    if flagged:
        out += ["| run | flag | first step | detail |", "|---|---|---|---|"]
        out += [f"| {r.name} | {f.name} | {f.step} | {f.detail.replace('|', '/')} |" for r, f in flagged]
    else:
        out.append("No flag fired.")
    out += ["", "Thresholds: " + ", ".join(f"{k}={v}" for k, v in asdict(report.thresholds).items())
            + f". Breaking flags (for *breaks training*): {', '.join(BREAKING_FLAGS)}; kl_drift is a warning.",
            "", "## Runs", "", runs_table(report), ""]
    if figures is not None:
        out += ["## Figures", "", "Lines: mean over a variant's seeds; shaded: min–max over seeds; "
                "markers: the step a health flag first fired (x = diverged).", ""]
        out += [f"![{t}]({name})" for t, name in figures] or ["No figures: no run logged anything to draw."]
        out.append("")
    return "\n".join(out)


def flat_rows(report: Report) -> pd.DataFrame:
    """The variants table with one number per cell: report.csv and the W&B table."""
    records = []
    for row in report.rows:
        rec = {"variant": row["variant"], "kind": row["kind"], "tricks_on": ";".join(row["tricks_on"]),
               "seeds": ";".join(map(str, row["seeds"])), "reference": row["reference"], "metric": report.metric}
        for state in ("completed", "diverged", "failed", "running", "missing"):
            rec[f"n_{state}"] = row["status"].get(state, 0)
        rec["diverged_steps"] = ";".join(map(str, row["diverged_steps"]))
        for name in ("final", "auc", "delta"):
            est = row[name] or Estimate()
            rec.update({f"{name}_mean": est.mean, f"{name}_ci_low": est.low, f"{name}_ci_high": est.high,
                        f"{name}_n": est.n})
        for role in report.controls:   # columns only when the sweep has that control
            est = row[f"delta_vs_{role}"] or Estimate()
            rec.update({f"delta_vs_{role}": est.mean, f"delta_vs_{role}_ci_low": est.low,
                        f"delta_vs_{role}_ci_high": est.high, f"delta_vs_{role}_n": est.n,
                        f"beats_{role}": row.get(f"beats_{role}")})
        rec.update({k: row[k] for k in ("length", "truncated", "entropy", "kl", "wall_time_s")})
        rec["flags"] = ";".join(f"{k}:{n}" for k, n in sorted(row["flags"].items()))
        records.append(rec)
    return pd.DataFrame(records)


def report_json(report: Report, figures: list[tuple[str, str]] | None = None) -> dict:
    s = report.sweep

    def clean(value):
        if isinstance(value, Estimate):
            return clean(asdict(value))
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, (np.integer, np.floating)):
            return clean(value.item())
        return value

    return clean({
        "sweep": {"dir": str(s.dir), "name": s.name, "sweep_id": s.sweep_id, "mode": s.mode, "base": s.base,
                  "seeds": s.seeds, "wandb_group": s.wandb_group, "manifest_found": s.manifest_found,
                  "notes": s.notes},
        "metric": report.metric, "higher_is_better": report.higher_is_better,
        "thresholds": asdict(report.thresholds),
        "variants": report.rows, "verdicts": report.verdicts,
        **({"controls": report.controls, "against_controls": report.against_controls} if report.controls else {}),
        "runs": [{"run_dir": r.name, "variant": r.variant, "seed": r.seed, "state": r.state, "step": r.step,
                  "reason": r.reason, "wall_time_s": r.wall_time_s, "final": final_value(r.metrics, report.metric),
                  "auc": curve_mean(r.metrics, report.metric), "flags": [asdict(f) for f in r.flags],
                  "notes": r.notes} for r in s.runs],
        "figures": [name for _, name in figures or []],
        "diagnostics": report.diagnostics,
    })


def render_stdout(report: Report, fmt: str) -> str:
    if fmt == "csv":
        return flat_rows(report).to_csv(index=False)
    if fmt == "json":
        return json.dumps(report_json(report), indent=2)
    return render_markdown(report, figures=None)


# --------------------------------------------------------------------------- pictures
def plot_figures(report: Report, out_dir: Path) -> list[tuple[str, str]]:
    """PNG curves (one line per variant: mean over seeds, min–max shaded, flags marked) and
    the bar chart of Δ per trick. Returns (title, file name) pairs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    figures = []
    treatments = [v for v in report.sweep.variants if v["kind"] != "control"]
    colors = {v["name"]: plt.get_cmap("tab10")(i % 10) for i, v in enumerate(treatments)}
    # identical variants (a trick that changes nothing) would hide each other: vary the dashes
    styles = {v["name"]: ("-", "--", ":", "-.")[i % 4] for i, v in enumerate(treatments)}
    # controls are reference lines, not contenders: grey/black, dashed, thinner, drawn underneath
    for v in report.sweep.variants:
        if v["kind"] == "control":
            colors[v["name"]], styles[v["name"]] = CONTROL_STYLES.get(v.get("control"), ("gray", ":"))
    columns = [report.metric] + [c for c in CURVES if c != report.metric]
    for column in columns:
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        drawn, flag_marks = False, False
        for v in report.sweep.variants:
            control = v["kind"] == "control"
            series = {}
            for r in report.sweep.runs:
                col = kl_column(r.metrics) if column == "kl" else column
                if r.variant == v["name"] and col in r.metrics:
                    points = r.metrics[["step", col]].dropna()
                    if len(points):
                        series[r.name] = points.set_index("step")[col]
            if not series:
                continue
            table = pd.DataFrame(series).sort_index()
            mean = table.mean(axis=1)
            if control:
                label = f"control: {v.get('control') or v['name']} (n={len(series)})"
                ax.plot(mean.index, mean.values, color=colors[v["name"]], ls=styles[v["name"]], lw=1.4,
                        zorder=1.5, label=label)
            else:
                ax.plot(mean.index, mean.values, color=colors[v["name"]], ls=styles[v["name"]], lw=1.8,
                        marker="o" if len(mean) <= 40 else None, ms=3, label=f"{v['name']} (n={len(series)})")
            if len(series) > 1:
                ax.fill_between(table.index, table.min(axis=1), table.max(axis=1), color=colors[v["name"]],
                                alpha=0.08 if control else 0.18, lw=0, zorder=1 if control else None)
            for r in report.sweep.runs:
                for f in r.flags if r.variant == v["name"] else []:
                    y = float(np.interp(f.step, mean.index.to_numpy(float), mean.to_numpy(float)))
                    ax.plot([f.step], [y], marker="x" if f.name == "diverged" else "v", ms=9, mew=2,
                            color=colors[v["name"]], ls="none")
                    flag_marks = True
            drawn = True
        if not drawn:
            plt.close(fig)
            continue
        handles, labels = ax.get_legend_handles_labels()
        if flag_marks:
            handles += [Line2D([], [], marker="x", color="k", ls="none", mew=2),
                        Line2D([], [], marker="v", color="k", ls="none")]
            labels += ["diverged", "other health flag"]
        ax.legend(handles, labels, fontsize=8, loc="best")
        label = "KL (kl/k3, else kl/k1)" if column == "kl" else column
        ax.set(xlabel="step", ylabel=label, title=f"{label}: mean over seeds, min–max shaded")
        ax.grid(alpha=0.3)
        name = f"curve_{column.replace('/', '_')}.png"
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        figures.append((label, name))

    bars = report.verdicts  # a trick with no Δ (e.g. it breaks training) gets a labelled empty row
    if bars:
        counts = Counter(v["trick"] for v in bars)
        labels = [v["trick"] if counts[v["trick"]] == 1 else f"{v['trick']} ({v['with']} vs {v['without']})"
                  for v in bars]
        means = np.array([v["delta"].mean if v["delta"].mean is not None else 0.0 for v in bars])
        err = np.array([[v["delta"].mean - v["delta"].low, v["delta"].high - v["delta"].mean]
                        if v["delta"].has_ci else [0.0, 0.0] for v in bars]).T
        fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.45 * len(bars)))
        y = np.arange(len(bars))
        ax.barh(y, means, xerr=err, capsize=4, color=[VERDICT_COLORS[v["verdict"]] for v in bars],
                edgecolor="black", lw=0.5)
        ax.axvline(0.0, color="black", lw=0.8)
        ax.margins(x=0.15)
        ax.set_yticks(y, [f"{l}: {v['verdict']}" for l, v in zip(labels, bars)], fontsize=8)
        for i, v in enumerate(bars):
            if v["delta"].mean is None:
                ax.text(0, i, "  no Δ: no completed runs on one side", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set(xlabel=f"Δ {report.metric} (with − without)", title="Effect of each trick, 95% CI")
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "delta.png", dpi=110)
        plt.close(fig)
        figures.append(("Δ per trick", "delta.png"))
    from grpo_ablate.report.diagnostics import plot
    figures += plot(report, out_dir, plt)   # the interaction heatmap, when the sweep has pairs
    return figures


def write_report(report: Report, out_dir: Path, figures: bool = True) -> list[Path]:
    """report.md, report.csv, report.json (always all three) and, with figures, the PNGs."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = plot_figures(report, out_dir) if figures else None
    texts = {"report.md": render_markdown(report, drawn), "report.csv": flat_rows(report).to_csv(index=False),
             "report.json": json.dumps(report_json(report, drawn), indent=2) + "\n"}
    for name, text in texts.items():  # --watch rewrites them while someone may be reading: atomically
        tmp = out_dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out_dir / name)
    return [out_dir / name for name in texts] + [out_dir / name for _, name in drawn or []]


# --------------------------------------------------------------------------- thresholds, W&B, watch
def parse_thresholds(items: list[str]) -> HealthThresholds:
    """`name=value` pairs over the defaults; bad names or values are a ReportError."""
    th = HealthThresholds()
    types = {f.name: type(getattr(th, f.name)) for f in fields(th)}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in types:
            raise ReportError(f"--threshold {item!r}: expected name=value with name one of {', '.join(types)}")
        try:
            setattr(th, name.strip(), types[name.strip()](value))
        except ValueError:
            raise ReportError(f"--threshold {item!r}: {value!r} is not a{'n integer' if types[name.strip()] is int else ' number'}")
    return th


def _logger_settings(report: Report) -> tuple[str, str | None]:
    """Project and entity the sweep's runs logged to (from their config.yaml)."""
    for r in report.sweep.runs:
        project = _dig(r.config, "logger", "project")
        if project:
            return str(project), _dig(r.config, "logger", "entity")
    return "grpo-ablate", None


def log_to_wandb(report: Report, out_dir: Path, figures: list[Path]) -> str:
    """The table, the verdicts and the PNGs to a summary run (job_type `report`) in the
    sweep's W&B group; offline by itself when no API key is configured, like the runs."""
    import wandb

    project, entity = _logger_settings(report)
    mode = os.environ.get("WANDB_MODE") or ("online" if wandb_api_key() else "offline")
    group = report.sweep.wandb_group or report.sweep.name
    run = wandb.init(project=project, entity=entity, dir=str(out_dir), mode=mode, group=group,
                     job_type="report", name=f"report-{report.sweep.name}",
                     config={"metric": report.metric, "sweep_id": report.sweep.sweep_id,
                             "thresholds": asdict(report.thresholds)},
                     settings=wandb.Settings(x_disable_stats=True, console="off", silent=True))
    verdicts = pd.DataFrame([{"trick": v["trick"], "with": v["with"], "without": v["without"],
                              "verdict": v["verdict"], "delta": v["delta"].mean, "ci_low": v["delta"].low,
                              "ci_high": v["delta"].high, "why": v["why"]} for v in report.verdicts])
    data = {"report/variants": wandb.Table(dataframe=flat_rows(report))}
    if len(verdicts):
        data["report/verdicts"] = wandb.Table(dataframe=verdicts)
    data.update({f"report/{p.stem}": wandb.Image(str(p)) for p in figures if p.suffix == ".png"})
    run.log(data)
    run_id = run.id
    run.finish()
    return f"W&B {mode} run {run_id} (group {group}, job_type report)"


def check_wandb_report() -> None:
    """A W&B Report exists only online: refuse early, with the reason, in one line."""
    mode = os.environ.get("WANDB_MODE")
    if mode in ("offline", "disabled", "dryrun"):
        raise ReportError(f"--wandb-report builds a W&B Report online, but WANDB_MODE={mode}")
    if not wandb_api_key():
        raise ReportError("--wandb-report needs a W&B login (WANDB_API_KEY or `wandb login`): "
                          "W&B Reports exist only online")
    import importlib.util

    if importlib.util.find_spec("wandb_workspaces") is None:
        raise ReportError("--wandb-report needs wandb-workspaces: pip install wandb-workspaces")


def build_wandb_report(report: Report) -> str:
    """A W&B Report with the verdicts and comparison panels over the sweep's group. Online
    only (check_wandb_report first); returns its URL."""
    import wandb_workspaces.reports.v2 as wr

    project, entity = _logger_settings(report)
    group = report.sweep.wandb_group or report.sweep.name
    metrics = [report.metric] + [c for c in ("reward/mean", "length/mean", "policy/entropy", "kl/k3")
                                 if c != report.metric]
    runset = wr.Runset(entity=entity or "", project=project, name=group,
                       filters=f"Group = '{group}' and JobType != 'report'", groupby=["config.sweep.variant"])
    panels = [wr.LinePlot(title=m, x="Step", y=[m], groupby_aggfunc="mean", groupby_rangefunc="minmax")
              for m in metrics] + [wr.RunComparer(diff_only="split")]
    kwargs = {"entity": entity} if entity else {}
    doc = wr.Report(project=project, title=f"grpo-ablate: {report.sweep.name}"[:128],
                    description=f"Which tricks matter ({report.metric}); made by grpo-ablate report",
                    blocks=[wr.H1(text="Verdicts per trick"), wr.MarkdownBlock(text="\n".join(verdict_lines(report))),
                            *([wr.H1(text="Against the controls"), wr.MarkdownBlock(text="\n".join(control_lines(report)))]
                              if report.controls else []),
                            wr.H1(text="Variants"), wr.MarkdownBlock(text=variants_table(report)),
                            wr.PanelGrid(runsets=[runset], panels=panels)], **kwargs)
    doc.save()
    return doc.url


def watch(sweep_dir: Path, every: float, out_dir: Path, fmt: str, **options) -> Report:
    """Re-render every `every` seconds until every run has finished (completed, diverged or
    failed); the text files are rewritten each time (figures are drawn by the caller once it
    returns). Ctrl-C propagates to the caller."""
    while True:
        report = build_report(sweep_dir, **options)
        if not report.finished:  # once finished, the caller writes the files, figures included
            write_report(report, out_dir, figures=False)
        done = sum(r.state in FINISHED for r in report.sweep.runs)
        if sys.stdout.isatty():
            print("\033[2J\033[H", end="")
        print(f"--- {time.strftime('%H:%M:%S')}: {done}/{len(report.sweep.runs)} runs finished ---")
        print(render_stdout(report, fmt), flush=True)
        if report.finished:
            return report
        time.sleep(every)
