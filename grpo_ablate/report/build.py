"""The report, computed once: per variant a row of numbers, per contrast a verdict, per
treatment and control a comparison, and the diagnostics sections. Rendering (render.py,
plots.py) and writing (write.py) only read a `Report`."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from grpo_ablate.design import Variant
from grpo_ablate.evals.protocol import ACCURACY, metric_column, parse_metric
from grpo_ablate.errors import ReportError
from grpo_ablate.config.pair_rules import variant_lines
from grpo_ablate.report.boundary import boundary_section
from grpo_ablate.report.claims import claims_section
from grpo_ablate.report.curves import DEFAULT_K, Summary, curve, final_value, kl_column
from grpo_ablate.report.diagnostics import analyse as analyse_diagnostics
from grpo_ablate.report.evidence import Evidence, gather
from grpo_ablate.report.health import HealthThresholds
from grpo_ablate.report.load import FINISHED, Run, Sweep, load_sweep, nested_value
from grpo_ablate.report.metric import Metric
from grpo_ablate.report.protocols import EvalSource, add_eval_metric, choose_eval
from grpo_ablate.report.placebo import placebo_section
from grpo_ablate.report.power import cost_to_decide, reason_to_decide, sequential_section
from grpo_ablate.report.scaling import fit_section, predict_section
from grpo_ablate.report.training import training_section
from grpo_ablate.report.transfer import transfer_section
from grpo_ablate.report.verdicts import UNDECIDED, against_controls, contrast_verdicts, decide_by_delta
from grpo_ablate.stats import group_sequential as seq
from grpo_ablate.stats.aggregate import aggregate_iqm, probability_of_improvement
from grpo_ablate.stats.error_control import ALPHA
from grpo_ablate.stats.intervals import finite_mean, mean_ci

# The summaries the report compares side by side (its "Run summaries" section), whichever decides
COMPARED_SUMMARIES = ("final", "auc", "best", "last_k")


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
    summary: Summary = field(default_factory=Summary)      # how a run's curve became the number compared
    summaries: list = field(default_factory=list)          # every summary's verdicts, side by side
    fits: dict = field(default_factory=dict)               # scaling.fit_section: A, B, the split verdicts
    predictions: dict | None = None                        # scaling.predict_section: predicted verdicts
    aggregates: dict = field(default_factory=dict)         # rliable's IQM and probability of improvement
    transfer: dict | None = None                           # transfer.transfer_section: across contexts
    evidence: Evidence | None = None                       # what the tests ran on, and their error control
    exploratory: str | None = None                         # why these verdicts are not the sweep's fixed test
    compute: str = "tokens"                                # the x axis of auc and the fits: tokens | wall
    training: dict | None = None                           # training.training_section: training vs its start
    sensitivity: dict | None = None                        # the trick verdicts again under --test paired
    placebo: dict | None = None                            # placebo.placebo_section: an A/A sweep's check
    claims: list | None = None                             # claims.claims_section: the papers' claims, one context
    eval: EvalSource | None = None                         # protocols.choose_eval: which eval the numbers come from
    boundary: dict | None = None                           # boundary.boundary_section: pass@k, against the base

    @property
    def controls(self) -> dict:
        """role -> control variant name, for the controls this sweep has."""
        return self.sweep.controls

    @property
    def finished(self) -> bool:
        return bool(self.sweep.runs) and all(r.state in FINISHED for r in self.sweep.runs)


def normalize_metric(name: str) -> str:
    """`eval_accuracy` means `eval/accuracy` (metric prefixes have no underscores); an eval metric may be
    given by its kind (`pass@8`, `avg@8`, `maj@8`: evals/protocol.py)."""
    name = name if "/" in name or "_" not in name else name.replace("_", "/", 1)
    return metric_column(name)


def build_report(sweep_dir: Path, metric: str | None = None, thresholds: HealthThresholds | None = None,
                 higher_is_better: bool = True, conflict_threshold: float = -0.1,
                 effect: float | None = None, summary: Summary | str | None = None,
                 predict_from: float | None = None, compute: str = "tokens", error_control: str = "holm",
                 alpha: float = ALPHA, test: str = "blocked", eval_name: str | None = None) -> Report:
    """Everything the table, verdicts and pictures say, computed once. Raises ReportError
    for a missing dir or a metric that no run logged. `metric`: None compares the one the sweep fixed
    before its first run (eval/accuracy where it fixed none). `effect`: the smallest Δ that matters
    (no-effect verdicts, and the seeds needed to detect it). `summary`: how a run's curve
    becomes the number compared (report/curves.py). `predict_from`: predict every contrast's
    verdict from this fraction of each run's steps (a sweep still running is predicted anyway).
    `compute`: the x axis of auc and the fits, tokens or wall (report/curves.py). `error_control`
    (holm | bh | none) and `alpha`: how the report's family of tests is adjusted (stats/error_control.py);
    `test`: blocked (each star family of contrasts as a block design, stats/blocked.py) or paired.
    `eval_name`: the eval protocol whose numbers are compared (report/protocols.py; None: the one the
    sweep fixed, else the runs' own)."""
    thresholds = thresholds or HealthThresholds()
    sweep = load_sweep(sweep_dir, thresholds)
    fixed = sweep.decides_on or {}
    metric = normalize_metric(metric or fixed.get("metric") or ACCURACY)   # unasked: the one the sweep fixed
    source = choose_eval(sweep, eval_name)                              # the eval every eval number comes from
    add_eval_metric(sweep, metric)
    measured = Metric(metric, higher_is_better)                         # which way is better, asked of it
    summary = decision_summary(fixed, metric, summary, source)
    check_logged(sweep, metric, source)
    runs_of, curves = read_curves(sweep, metric, compute)                # read once, summarised many ways
    note_short_curves(sweep, curves, metric, summary)
    note_pair_rules(sweep)
    per_run = lambda how: {name: {key: how.of(c, measured.higher_is_better) for key, c in cs.items()}
                           for name, cs in curves.items()}
    finals, areas = per_run(Summary("final")), per_run(Summary("auc"))
    values = finals if summary.how == "final" else per_run(summary)     # what the verdicts compare
    sequential, not_sequential = sequential_section(sweep, measured, summary.label)
    evidence = gather(values, runs_of, curves, measured, summary, error_control, alpha, test)
    model_families(sweep, evidence)
    rows = [variant_row(sweep, v, runs_of, finals, areas, values, summary, evidence) for v in sweep.variants]
    against = against_controls(sweep, evidence, sequential)
    for c in against:   # the verdict against each control, as a column of the variant's row
        next(r for r in rows if r["variant"] == c["variant"])[f"beats_{c['role']}"] = c["beats"]
    verdicts = contrast_verdicts(sweep, evidence, areas, sequential, effect)
    check_known_answers(sweep, verdicts)
    sensitivity = None if sequential is not None or test == "paired" else paired_sensitivity(
        sweep, gather(values, runs_of, curves, measured, summary, error_control, alpha, "paired"), areas, effect)
    report = Report(sweep, metric, higher_is_better, thresholds, rows, verdicts, against, summary=summary,
                    evidence=evidence, exploratory=exploratory(fixed, metric, summary, source), compute=compute,
                    sensitivity=sensitivity, eval=source)
    report.training = training_section(sweep, evidence, curves, against)
    report.diagnostics = analyse_diagnostics(report, conflict_threshold)
    report.power = power_section(sweep, verdicts, sequential, not_sequential, effect)
    if sweep.contrasts:
        report.summaries = compare_summaries(sweep, per_run, runs_of, curves, areas, effect, summary, evidence)
    report.placebo = placebo_section(report)
    report.fits = fit_section(sweep, metric, higher_is_better, curves)
    report.aggregates = aggregates(sweep, values, measured)
    report.transfer = transfer_section(sweep, verdicts, values, measured)
    report.boundary = boundary(sweep, source, compute, error_control, alpha, test)
    report.claims = claims_section(sweep, verdicts, report.fits, sampled_measures(report))
    report.predictions = predict_section(sweep, metric, summary, higher_is_better, predict_from, decide_by_delta,
                                         compute)
    if report.predictions is not None and report.finished:   # a finished sweep: set beside what it measured
        measured = {v["trick"]: v["verdict"] for v in verdicts}
        for p in report.predictions["contrasts"]:
            p["measured"] = measured.get(p["trick"])
    return report


def boundary(sweep: Sweep, source: EvalSource, compute: str, method: str, alpha: float, test: str) -> dict | None:
    """The reasoning-boundary section (report/boundary.py) on pass@n of an eval of n >= 2 samples per problem."""
    n = source.protocol.samples
    if n < 2 or sweep.contexts:
        return None
    add_eval_metric(sweep, f"eval/pass@{n}")
    runs_of, curves = read_curves(sweep, f"eval/pass@{n}", compute)
    return boundary_section(sweep, source, runs_of, curves, method, alpha, test,
                            averages=read_curves(sweep, ACCURACY, compute))


def sampled_measures(report: Report) -> dict:
    """What the report's eval measured for the claims about a sampled eval's metrics (report/claims.py)."""
    n = report.eval.protocol.samples if report.eval else 1
    if n < 2:
        return {"why": "not measured: the eval drew one answer per problem (`grpo-ablate eval DIR eval=sampled`, "
                       "then `report --eval sampled`)"}
    boundary = report.boundary or {}
    tricks = {t["trick"]: t["verdict"] for t in boundary.get("tricks", [])}
    averages = ({v["trick"]: v["verdict"] for v in report.verdicts} if report.metric == ACCURACY and
                report.summary.how == "final" else {t["trick"]: t["verdict"] for t in boundary.get("tricks_avg", [])})
    return {"k": n, "avg@k": averages, "pass@k": tricks}


def model_families(sweep: Sweep, evidence: Evidence) -> None:
    """Give the evidence the report's trick contrasts, so that each star among them is tested as a block
    design (stats/blocked.py). The controls family stays paired: its hub, the untrained base, is one
    set of weights at every seed (greedy: the same numbers; sampled: only the eval's draws move it),
    a spread the model would read as training noise and pool with its leaves'."""
    evidence.model([(c.with_, c.without) for c in sweep.contrasts])


def paired_sensitivity(sweep: Sweep, paired: Evidence, areas: dict, effect: float | None) -> dict | None:
    """The trick verdicts again with a paired t per contrast (the report's error control): how much of
    what the blocked model decides rests on its borrowing. None without contrasts."""
    if not sweep.contrasts:
        return None
    verdicts = contrast_verdicts(sweep, paired, areas, None, effect, power=False)
    return {"test": "paired", "label": verdicts[0]["family"]["label"],
            "decided": sum(v["verdict"] not in UNDECIDED for v in verdicts),
            "contrasts": len(verdicts),
            "verdicts": {v["trick"]: {"verdict": v["verdict"], "p_adjusted": v["delta"].p_adjusted}
                         for v in verdicts}}


def check_logged(sweep: Sweep, metric: str, source: EvalSource | None = None) -> None:
    """ReportError for a metric that no run logged (a sweep without runs yet has nothing to check)."""
    logged = set().union(*(r.metrics.columns for r in sweep.runs)) - {"step"} if sweep.runs else set()
    if logged and metric not in logged:
        shown = sorted(c for c in logged if c.startswith(('eval/', 'reward/', 'train/')))
        kind = parse_metric(metric)
        if kind is not None and source is not None and kind[0] != "avg":
            raise ReportError(f"metric {metric!r}: {source.describe()} cannot give it (pass@k and maj@k need k <= "
                              f"the {source.protocol.samples} sample(s) per problem, maj@k a task that parses "
                              f"answers); logged: {', '.join(shown)}, ...")
        raise ReportError(f"metric {metric!r} is in no run's metrics.jsonl; logged: {', '.join(shown)}, ...")


def read_curves(sweep: Sweep, metric: str, compute: str) -> tuple[dict, dict]:
    """(variant -> its runs, variant -> {seed: Curve} of its completed runs). A NaN or Inf where the
    metric should be is not a number to average: the run is noted and left out of every statistic."""
    runs_of = {v.name: [r for r in sweep.runs if r.variant == v.name] for v in sweep.variants}
    for r in sweep.runs:
        if r.state == "completed" and metric in r.nonfinite:
            r.notes.append(f"`{metric}` is not finite at step {r.nonfinite[metric]}: this run is left out of "
                           "every statistic (re-run it, or look at why its eval failed)")
    usable = lambda r: r.state == "completed" and metric not in r.nonfinite
    return runs_of, {name: {r.key: curve(r.metrics, metric, compute) for r in runs if usable(r)}
                     for name, runs in runs_of.items()}


def power_section(sweep: Sweep, verdicts: list[dict], sequential: dict | None, not_sequential: str | None,
                  effect: float | None) -> dict:
    """What deciding the open contrasts would take (power.cost_to_decide), and how the verdicts were
    decided: a sequential sweep's looks, or why its looks do not apply to this report."""
    return {**cost_to_decide(verdicts, UNDECIDED, sweep.runs), "sequential": sequential is not None,
            "effect": effect, "note": not_sequential,
            **({"looks": len(sequential["looks"]), "max_seeds": sequential["max_seeds"],
                "stopped": (sequential.get("stopped") or {}).get("reason")} if sequential else {})}


def decision_summary(fixed: dict, metric: str, summary: Summary | str | None, source: EvalSource | None = None
                     ) -> Summary:
    """The summary asked for, else the one the sweep fixed before its first run (`final` for sweeps
    that fixed none, or fixed it for another metric or eval; and for an eval scored after training at
    the start and the end alone, whose `last_k` would average the start in)."""
    if summary is None:
        same = fixed.get("metric", metric) == metric and fixed_eval(fixed, source) == used_eval(source)
        summary = fixed.get("summary") if same and fixed.get("summary") else "final"
        if source is not None and source.after_training and len(source.steps) <= 2:
            summary = "final"
        try:
            return Summary.parse(summary)
        except ValueError as err:   # the manifest's, damaged: the user's own is checked by the command line
            raise ReportError(f"manifest.json fixes decides_on.summary={summary!r}, which the report cannot read "
                              f"({err}); give --summary to decide on another") from None
    return summary if isinstance(summary, Summary) else Summary.parse(summary)


def fixed_eval(fixed: dict, source: EvalSource | None) -> str | None:
    """The eval a sweep fixed before its first run (None: the runs' own); a fixed name that is the
    runs' own protocol (the sweep ran with eval=<it>) is the runs' own."""
    name = fixed.get("eval")
    return None if source is not None and name == source.name and not source.after_training else name


def used_eval(source: EvalSource | None) -> str | None:
    """The eval a report reads, as fixed_eval names it (None: the runs' own)."""
    return source.name if source is not None and source.after_training else None


def note_short_curves(sweep: Sweep, curves: dict, metric: str, summary: Summary) -> None:
    """last_k over runs with fewer than k evals is still computed, over fewer evals than its name
    says: said in the sweep's notes, not hidden."""
    short = sum(len(c) < summary.k for cs in curves.values() for c in cs.values()) if summary.how == "last_k" else 0
    if short:
        sweep.notes.append(f"{summary.label}: {short} run(s) logged fewer than {summary.k} evals of `{metric}`; "
                           "their number is the mean of every eval they logged, the base eval at step 0 included")


def note_pair_rules(sweep: Sweep) -> None:
    """The pair rules (config/pair_rules.py) that hold in the runs' configs, each in one note naming its
    variants; those the sweep expected (its file's expected_pairs) are not noted."""
    configs: dict = {}
    for run in sweep.runs:
        if run.config and run.variant not in configs:
            configs[run.variant] = OmegaConf.create(run.config)
    sweep.notes += variant_lines(configs, sweep.expected_pairs)


def exploratory(fixed: dict, metric: str, summary: Summary, source: EvalSource | None = None) -> str | None:
    """Why the verdicts are exploratory: the sweep fixed another metric, summary or eval before its
    first run (a choice made after seeing the curves is not covered by the error control); None when not."""
    if not fixed:
        return None
    chosen, used = fixed_eval(fixed, source), used_eval(source)
    settings = fixed.get("eval_protocol")
    if chosen is not None and chosen == used and settings and settings != source.protocol.settings():
        return (f"this sweep fixed eval `{chosen}` as {settings} before its first run, and its results were scored "
                f"as {source.protocol.settings()}: verdicts on them are exploratory")
    if fixed.get("metric") != metric or fixed.get("summary", "final") != summary.label or chosen != used:
        of = lambda name: f" of eval `{name}`" if name else ""
        return (f"this sweep fixed `{fixed.get('summary', 'final')}` of `{fixed.get('metric')}`{of(chosen)} before its "
                f"first run; verdicts on the {summary.label} of `{metric}`{of(used)} are exploratory (a summary chosen "
                "after seeing the curves is not covered by the error control)")
    return None


def aggregates(sweep: Sweep, values: dict, metric: Metric) -> dict:
    """rliable's numbers on the compared summary: each variant's IQM over its seeds, and each
    contrast's probability that a run with the trick beats one without, with stratified
    bootstrap intervals. One sweep is one task (stratum)."""
    task = "this sweep"
    return {"variants": {name: aggregate_iqm({task: list(v.values())}) for name, v in values.items()},
            "contrasts": [{"trick": c.trick, "with": c.with_, "without": c.without,
                           "improvement": probability_of_improvement(
                               {task: list(values.get(c.with_, {}).values())},
                               {task: list(values.get(c.without, {}).values())},
                               higher_is_better=metric.higher_is_better)} for c in sweep.contrasts]}


def compare_summaries(sweep: Sweep, per_run, runs_of: dict, curves: dict, areas: dict, effect: float | None,
                      chosen: Summary, evidence: Evidence) -> list[dict]:
    """Every summary's verdicts on this sweep (fixed design, the report's error control), with the
    paired SD and, where the report has a reason to decide the contrast (`reason_to_decide`: --effect, or
    an unadjusted 95% interval that excludes 0), the seeds one paired t at 5% needs for 80% power against
    that effect (the chosen summary's k for last_k). Only the chosen one decides; the others are exploratory."""
    out = []
    for how in COMPARED_SUMMARIES:
        s = Summary(how, chosen.k if chosen.how == "last_k" else DEFAULT_K)
        other = gather(per_run(s), runs_of, curves, evidence.metric, s, evidence.method, evidence.alpha, evidence.test)
        model_families(sweep, other)
        verdicts = contrast_verdicts(sweep, other, areas, None, effect, power=False)
        out.append({"summary": s.label, "chosen": s == chosen or (how == chosen.how == "final"),
                    "decided": sum(v["verdict"] not in UNDECIDED for v in verdicts),
                    "contrasts": [{"trick": v["trick"], "verdict": v["verdict"], "delta": v["delta"],
                                   "sd": v["power"].get("sd"),
                                   "seeds_needed": seq.seeds_needed(
                                       effect if effect is not None else v["delta"].mean or 0.0,
                                       v["power"].get("sd") or 0.0)
                                   if reason_to_decide(v["delta"], effect) else None}
                                  for v in verdicts]})
    return out


def check_known_answers(sweep: Sweep, verdicts: list[dict]) -> None:
    """A `variants` sweep file's known answers: each contrast whose variant says what verdict a
    correct report gives it gets `expected` (those verdicts) and `as_expected` (whether it got one)."""
    expected = {v.name: v.expect for v in sweep.variants}
    for v in verdicts:
        if expected.get(v["with"]):
            v["expected"] = list(expected[v["with"]])
            v["as_expected"] = v["verdict"] in v["expected"]


def variant_row(sweep: Sweep, v: Variant, runs_of: dict[str, list[Run]], finals: dict, areas: dict, values: dict,
                summary: Summary, evidence: Evidence) -> dict:
    """One row of the variants table: its runs' states, the metric's final value and AUC with
    their CIs (and the compared summary's, when it is neither), Δ vs its reference and vs each
    control on the compared summary, the last logged health numbers."""
    runs = runs_of[v.name]
    done = [r for r in runs if r.state == "completed"]
    reference = v.reference if v.reference in runs_of else None
    row = {
        "variant": v.name, "kind": v.kind, "tricks_on": list(v.tricks_on),
        "reference": reference,
        "seeds": sorted({r.seed for r in runs if r.state != "missing" and r.seed is not None}),
        "status": Counter(r.state for r in runs),
        "diverged_steps": [r.step for r in runs if r.state == "diverged"],
        "running_steps": [r.step for r in runs if r.state == "running"],
        "final": mean_ci(finals[v.name].values()),
        "auc": mean_ci(areas[v.name].values()),
        **({} if summary.how in ("final", "auc") else {"summary": mean_ci(values[v.name].values())}),
        "delta": evidence.delta(v.name, reference) if reference else None,
        "length": finite_mean([final_value(r.metrics, "length/mean") for r in done]),
        "truncated": finite_mean([final_value(r.metrics, "length/truncated_frac") for r in done]),
        "entropy": finite_mean([final_value(r.metrics, "policy/entropy") for r in done]),
        "kl": finite_mean([final_value(r.metrics, kl_column(r.metrics)) for r in done if kl_column(r.metrics)]),
        "wall_time_s": finite_mean([r.wall_time_s for r in done]),
        "flags": Counter(f.name for r in runs for f in r.flags),
    }
    if v.kind == "control":
        row["control"] = v.control
        row["budget"] = next((str(b) for r in runs if (b := nested_value(r.config, "control", "budget"))), None)
    # the controls' columns: only when the sweep has them, so a sweep without is unchanged
    for role in sweep.controls:
        control = sweep.control_of(v.context, role)   # its own context's, in a sweep across contexts
        row[f"delta_vs_{role}"] = None if control in (None, v.name) else evidence.delta(v.name, control)
    return row
