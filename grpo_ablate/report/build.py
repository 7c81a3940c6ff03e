"""The report, computed once: per variant a row of numbers, per contrast a verdict, per
treatment and control a comparison, and the diagnostics sections. Rendering (render.py,
plots.py) and writing (write.py) only read a `Report`."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from grpo_ablate.errors import ReportError
from grpo_ablate.report.diagnostics import analyse as analyse_diagnostics
from grpo_ablate.report.health import HealthThresholds
from grpo_ablate.report.load import FINISHED, Run, Sweep, load_sweep, nested_value
from grpo_ablate.report.power import cost_to_decide, sequential_section
from grpo_ablate.report.stats import curve_mean, delta_ci, final_value, finite_mean, kl_column, mean_ci
from grpo_ablate.report.verdicts import UNDECIDED, against_controls, contrast_verdicts


@dataclass
class Report:
    sweep: Sweep
    metric: str
    higher_is_better: bool
    thresholds: HealthThresholds
    rows: list        # one dict per variant
    verdicts: list    # one dict per contrast
    against_controls: list = field(default_factory=list)   # one dict per treatment and control
    diagnostics: dict = field(default_factory=dict)        # diagnostics.analyse: conflicts, interactions
    power: dict = field(default_factory=dict)              # power.cost_to_decide, and how verdicts were decided

    @property
    def controls(self) -> dict:
        """role -> control variant name, for the controls this sweep has."""
        return self.sweep.controls

    @property
    def finished(self) -> bool:
        return bool(self.sweep.runs) and all(r.state in FINISHED for r in self.sweep.runs)


def normalize_metric(name: str) -> str:
    """`eval_accuracy` means `eval/accuracy` (metric prefixes have no underscores)."""
    return name if "/" in name or "_" not in name else name.replace("_", "/", 1)


def build_report(sweep_dir: Path, metric: str = "eval/accuracy", thresholds: HealthThresholds | None = None,
                 higher_is_better: bool = True, conflict_threshold: float = -0.1,
                 effect: float | None = None) -> Report:
    """Everything the table, verdicts and pictures say, computed once. Raises ReportError
    for a missing dir or a metric that no run logged. `effect`: the smallest Δ that matters
    (no-effect verdicts, and the seeds needed to detect it)."""
    thresholds = thresholds or HealthThresholds()
    sweep = load_sweep(sweep_dir, thresholds)
    metric = normalize_metric(metric)
    logged = set().union(*(r.metrics.columns for r in sweep.runs)) - {"step"} if sweep.runs else set()
    if logged and metric not in logged:
        shown = sorted(c for c in logged if c.startswith(('eval/', 'reward/', 'train/')))
        raise ReportError(f"metric {metric!r} is in no run's metrics.jsonl; logged: {', '.join(shown)}, ...")

    runs_of = {v["name"]: [r for r in sweep.runs if r.variant == v["name"]] for v in sweep.variants}
    finals = {name: {r.key: final_value(r.metrics, metric) for r in runs if r.state == "completed"}
              for name, runs in runs_of.items()}
    areas = {name: {r.key: curve_mean(r.metrics, metric) for r in runs if r.state == "completed"}
             for name, runs in runs_of.items()}
    rows = [variant_row(sweep, v, runs_of, finals, areas) for v in sweep.variants]
    sequential, not_sequential = sequential_section(sweep, metric, higher_is_better)
    against = against_controls(sweep, finals, higher_is_better, sequential)
    for c in against:   # the verdict against each control, as a column of the variant's row
        next(r for r in rows if r["variant"] == c["variant"])[f"beats_{c['role']}"] = c["beats"]
    verdicts = contrast_verdicts(sweep, finals, areas, higher_is_better, sequential, effect)
    check_known_answers(sweep, verdicts)
    report = Report(sweep, metric, higher_is_better, thresholds, rows, verdicts, against)
    report.diagnostics = analyse_diagnostics(report, conflict_threshold)
    report.power = {**cost_to_decide(verdicts, UNDECIDED, sweep.runs), "sequential": sequential is not None,
                    "effect": effect, "note": not_sequential,
                    **({"looks": len(sequential["looks"]), "max_seeds": sequential["max_seeds"],
                        "stopped": (sequential.get("stopped") or {}).get("reason")} if sequential else {})}
    return report


def check_known_answers(sweep: Sweep, verdicts: list[dict]) -> None:
    """A `variants` sweep file's known answers: each contrast whose variant says what verdict a
    correct report gives it gets `expected` (those verdicts) and `as_expected` (whether it got one)."""
    expected = {v["name"]: v.get("expect") or [] for v in sweep.variants}
    for v in verdicts:
        if expected.get(v["with"]):
            v["expected"] = list(expected[v["with"]])
            v["as_expected"] = v["verdict"] in v["expected"]


def variant_row(sweep: Sweep, v: dict, runs_of: dict[str, list[Run]], finals: dict, areas: dict) -> dict:
    """One row of the variants table: its runs' states, the metric's final value and AUC with
    their CIs, Δ vs its reference and vs each control, the last logged health numbers."""
    runs = runs_of[v["name"]]
    done = [r for r in runs if r.state == "completed"]
    reference = v.get("reference") if v.get("reference") in runs_of else None
    row = {
        "variant": v["name"], "kind": v.get("kind", "treatment"), "tricks_on": v["tricks_on"],
        "reference": reference,
        "seeds": sorted({r.seed for r in runs if r.state != "missing" and r.seed is not None}),
        "status": Counter(r.state for r in runs),
        "diverged_steps": [r.step for r in runs if r.state == "diverged"],
        "running_steps": [r.step for r in runs if r.state == "running"],
        "final": mean_ci(finals[v["name"]].values()),
        "auc": mean_ci(areas[v["name"]].values()),
        "delta": delta_ci(finals[v["name"]], finals[reference]) if reference else None,
        "length": finite_mean([final_value(r.metrics, "length/mean") for r in done]),
        "truncated": finite_mean([final_value(r.metrics, "length/truncated_frac") for r in done]),
        "entropy": finite_mean([final_value(r.metrics, "policy/entropy") for r in done]),
        "kl": finite_mean([final_value(r.metrics, kl_column(r.metrics)) for r in done if kl_column(r.metrics)]),
        "wall_time_s": finite_mean([r.wall_time_s for r in done]),
        "flags": Counter(f.name for r in runs for f in r.flags),
    }
    if v["kind"] == "control":
        row["control"] = v.get("control")
        row["budget"] = next((str(b) for r in runs if (b := nested_value(r.config, "control", "budget"))), None)
    # the controls' columns: only when the sweep has them, so a sweep without is unchanged
    for role, control in sweep.controls.items():
        row[f"delta_vs_{role}"] = None if control == v["name"] else delta_ci(finals[v["name"]], finals[control])
    return row
