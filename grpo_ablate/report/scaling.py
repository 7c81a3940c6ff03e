"""The report's curve sections: the fits over seeds, the ceiling/efficiency split of each
contrast, and verdicts predicted from a prefix of every run.

The design, its formulas and references: docs/curves.md, "Fits over seeds and predicted verdicts".
"""
from __future__ import annotations

import math
import statistics

import numpy as np

from grpo_ablate.design import Contrast
from grpo_ablate.report.curves import Curve, Summary, curve
from grpo_ablate.report.drift import DRIFT_ALPHA, arm_drift, binomial_se
from grpo_ablate.report.fits import CEILING_TOLERANCE, Fit, fit, pooled
from grpo_ablate.report.load import Run, Sweep, nested_value
from grpo_ablate.stats.exact import fisher_exact_p
from grpo_ablate.stats.intervals import Estimate, delta_ci, mean_ci
from grpo_ablate.stats.student import t_quantile

RAISES, LOWERS, SAME_CEILING = "raises the ceiling", "lowers the ceiling", "same ceiling"
FASTER, SLOWER = "learns faster", "learns slower"
NEITHER, POOR_FITS = "neither", "poor fits"
DRIFTS_MORE, DRIFTS_LESS, BOTH_DRIFT = "drifts more", "drifts less", "both drift"
SELECTED = "exclusion differs by arm"
UNSTABLE_WHY = "unstable: peaks and falls (drift test at 5%; each run's numbers in report.json)"
EXCLUSION_ALPHA = 0.05        # Fisher's exact test of excluded fits, with vs without
EXCLUSIONS = ("poor fit", "drifting")   # fits.Fit.excluded


def n_eval(run: Run) -> int | None:
    size = nested_value(run.config, "task", "eval_size")
    return int(size) if isinstance(size, (int, float)) and size > 0 else None


def applicable(sweep: Sweep, metric: str, higher_is_better: bool) -> str | None:
    """Why the fits do not apply to this metric (None when they do): a success rate in [0, 1]."""
    if not higher_is_better:
        return "the fits are of a success rate that rises with compute; this metric is lower-is-better"
    values = [v for r in sweep.runs if metric in r.metrics for v in r.metrics[metric].dropna()]
    if values and not all(0.0 <= v <= 1.0 for v in values):
        return f"the fits are of a success rate in [0, 1]; `{metric}` leaves that range"
    return None


# --------------------------------------------------------------------------- fits over seeds
def fit_section(sweep: Sweep, metric: str, higher_is_better: bool, curves: dict) -> dict:
    """{applicable, why, unit, variants: [...], contrasts: [...]} (see the module docstring);
    `curves`: variant -> {seed: Curve} of its completed runs."""
    why = applicable(sweep, metric, higher_is_better)
    if why:
        return {"applicable": False, "why": why, "variants": [], "contrasts": []}
    runs_of = {v.name: [r for r in sweep.runs if r.variant == v.name and r.state == "completed"]
               for v in sweep.variants}
    eval_sizes = {name: {r.key: n_eval(r) for r in runs} for name, runs in runs_of.items()}
    fits = {name: {k: fit(c, eval_sizes[name][k]) for k, c in cs.items()} for name, cs in curves.items()}
    treatments = {v.name for v in sweep.variants if v.kind != "control"}
    units = {c.unit for name, cs in curves.items() if name in treatments for c in cs.values() if len(c)}
    variants = []
    for v in sweep.variants:
        name = v.name
        if v.kind == "control":
            continue      # controls take part in no trick verdict (and the SFT control samples nothing to count)
        good = [f for f in fits[name].values() if f.ok]
        drift_p = arm_drift([f.drift for f in fits[name].values()])
        sizes = [s for s in eval_sizes[name].values() if s]
        pool = fit(pooled(list(curves[name].values())), sizes[0] if sizes else None) if curves[name] else Fit()
        variants.append({"variant": name, "runs": len(fits[name]), "ok": len(good),
                         "A": mean_ci([f.A for f in good]), "B": mean_ci([f.B for f in good if f.B_identified]),
                         "B_identified": sum(f.B_identified for f in good),
                         "C_mid": statistics.median([f.C_mid for f in good if f.B_identified])
                         if any(f.B_identified for f in good) else None,
                         "pooled": pool, "poor": sorted({UNSTABLE_WHY if f.unstable else f.why
                                                         for f in fits[name].values() if not f.ok}),
                         "excluded": exclusion_counts(fits[name], list(fits[name])),
                         "drift_p": drift_p, "unstable": drift_p is not None and drift_p < DRIFT_ALPHA,
                         "fits": fits[name], "curves": curves[name]})
    contrasts = [contrast_split(c, curves, fits, eval_sizes) for c in sweep.contrasts
                 if c.with_ in fits and c.without in fits]
    return {"applicable": True, "why": None, "unit": units.pop() if len(units) == 1 else "mixed",
            "variants": variants, "contrasts": contrasts}


def contrast_split(c: Contrast, curves: dict, fits: dict, eval_sizes: dict) -> dict:
    """ΔA over the seeds where both sides fit well; ΔB after refitting each pair at a shared A;
    both withheld when the fits used differ by arm (a drifting arm, or exclusion that differs)."""
    with_, without = c.with_, c.without
    keys = sorted(set(fits[with_]) & set(fits[without]), key=str)
    both = [k for k in keys if fits[with_][k].ok and fits[without][k].ok]
    counts = {"with": exclusion_counts(fits[with_], keys), "without": exclusion_counts(fits[without], keys)}
    drift_p = {"with": arm_drift([fits[with_][k].drift for k in keys]),
               "without": arm_drift([fits[without][k].drift for k in keys])}
    exclusion_p = exclusion_test(counts["with"], counts["without"])
    drifts = drift_verdict(drift_p["with"], drift_p["without"])
    selected = exclusion_p is not None and exclusion_p < EXCLUSION_ALPHA
    out = {"trick": c.trick, "with": with_, "without": without, "pairs": len(keys), "both_ok": len(both),
           "dA": Estimate(), "dB": Estimate(), "ceiling": None, "speed": None, "excluded": counts,
           "exclusion_p": exclusion_p, "drift_p": drift_p, "drift": drifts,
           "withheld": withheld_because(drifts, drift_p, selected, exclusion_p)}
    if len(both) < 2:
        why = f"{len(both)} of {len(keys)} seeds fit well on both sides (need 2)"
        out.update(split=" and ".join(x for x in (drifts, SELECTED if selected else None) if x) or POOR_FITS,
                   why=f"{out['withheld']}; {why}" if out["withheld"] else why)
        return out
    out["dA"] = delta_ci({k: fits[with_][k].A for k in both}, {k: fits[without][k].A for k in both})
    B_with, B_without = {}, {}
    identified = [k for k in both if fits[with_][k].B_identified and fits[without][k].B_identified]
    for k in identified:   # ScaleRL: compare B with A fixed at the pair's mean
        shared = (fits[with_][k].A + fits[without][k].A) / 2
        a = fit(curves[with_][k], eval_sizes[with_][k], A=shared)
        b = fit(curves[without][k], eval_sizes[without][k], A=shared)
        if a.B is not None and b.B is not None:
            B_with[k], B_without[k] = math.log(a.B), math.log(b.B)
    # B compared on the log scale: a ratio of efficiencies, and its spread is closer to normal
    out["dB"] = delta_ci(B_with, B_without)
    out["B_identified"] = len(identified)
    out["why"] = (f"A over {len(both)} seeds that fit well on both sides (of {len(keys)}); B over the "
                  f"{len(identified)} of them whose rise came after their first eval")
    if out["withheld"]:     # the fits that are left are a selected subset: ΔA and ΔB are shown, not read
        out["split"] = " and ".join(x for x in (drifts, SELECTED if selected else None) if x)
        out["why"] = f"{out['withheld']}; {out['why']}"
        return out
    out["ceiling"] = ceiling_verdict(out["dA"])
    out["speed"] = speed_verdict(out["dB"])
    decided = [x for x in (out["ceiling"], out["speed"]) if x in (RAISES, LOWERS, FASTER, SLOWER)]
    out["split"] = " and ".join(decided) if decided else NEITHER
    return out


def exclusion_counts(fits_of: dict, keys: list) -> dict:
    """How many of these runs' fits are used as ceilings and how many are not, by reason."""
    reasons = [fits_of[k].excluded for k in keys]
    return {"used": reasons.count(None), **{why: reasons.count(why) for why in EXCLUSIONS}}


def exclusion_test(with_counts: dict, without_counts: dict) -> float | None:
    """Fisher's exact test (two-sided) that the share of excluded fits differs by arm; None when
    neither arm excluded any (nothing to test) or an arm has no runs."""
    excluded = [sum(counts[why] for why in EXCLUSIONS) for counts in (with_counts, without_counts)]
    used = [with_counts["used"], without_counts["used"]]
    if not any(excluded) or any(e + u == 0 for e, u in zip(excluded, used)):
        return None
    return fisher_exact_p([[excluded[0], used[0]], [excluded[1], used[1]]])


def drift_verdict(p_with: float | None, p_without: float | None) -> str | None:
    """Which arm drifts as a whole (report/drift.arm_drift at DRIFT_ALPHA): the runs with the
    trick (*drifts more*), without it (*drifts less*), both, or neither (None)."""
    drift_with = p_with is not None and p_with < DRIFT_ALPHA
    drift_without = p_without is not None and p_without < DRIFT_ALPHA
    if drift_with and drift_without:
        return BOTH_DRIFT
    return DRIFTS_MORE if drift_with else DRIFTS_LESS if drift_without else None


def withheld_because(drifts: str | None, drift_p: dict, selected: bool, exclusion_p: float | None) -> str | None:
    """Why the fits' verdicts are withheld, in words; None when they are read."""
    reasons = []
    if drifts:
        arms = [side for side in ("with", "without") if drift_p[side] is not None and drift_p[side] < DRIFT_ALPHA]
        reasons.append(" and ".join(f"the runs {side} the trick drift (p = {drift_p[side]:.3f})" for side in arms)
                       + ": a drifting arm's fits read its drift as a lower ceiling")
    if selected:
        reasons.append(f"exclusion differs by arm (Fisher's exact p = {exclusion_p:.3f}): the seeds that fit are "
                       "a selected subset")
    return "; ".join(reasons) or None


def ceiling_verdict(dA: Estimate, tolerance: float = CEILING_TOLERANCE) -> str | None:
    if not dA.has_ci or dA.low == dA.high:
        return None
    if dA.low > 0 and dA.mean > tolerance:
        return RAISES
    if dA.high < 0 and dA.mean < -tolerance:
        return LOWERS
    if -tolerance < dA.low and dA.high < tolerance:
        return SAME_CEILING
    return None


def speed_verdict(dB: Estimate) -> str | None:
    if not dB.has_ci or dB.low == dB.high:
        return None
    return FASTER if dB.low > 0 else SLOWER if dB.high < 0 else None


# --------------------------------------------------------------------------- predictions
def planned_evals(run: Run, points: Curve) -> np.ndarray:
    """The steps at which the run will have evaluated by its end (config.yaml's steps, eval.every)."""
    steps = nested_value(run.config, "steps")
    every = nested_value(run.config, "eval", "every")
    if not isinstance(steps, (int, float)) or steps <= 0:
        return points.steps
    if not isinstance(every, (int, float)) or every <= 0:
        gaps = np.diff(points.steps)
        every = float(gaps[0]) if len(gaps) else float(steps)
    planned = np.arange(0, int(steps) + 1, int(every), dtype=float)
    return np.union1d(planned, [float(steps)])


def predict_run(run: Run, metric: str, summary: Summary, higher_is_better: bool,
                fraction: float | None, axis: str = "tokens") -> tuple[float | None, str, float]:
    """(the run's predicted summary, how, the variance of its extrapolation error): `observed`
    (variance 0) when the run's curve is complete, `fit` or `flat` when part of it was
    extrapolated; None when nothing was logged."""
    points = curve(run.metrics, metric, axis)
    if len(points) == 0:
        return None, "nothing logged", 0.0
    planned = planned_evals(run, points)
    if fraction is not None:
        points = points.upto(fraction * planned[-1])
    todo = planned[planned > (points.steps[-1] if len(points) else -1)]
    if len(todo) == 0:
        return summary.of(points, higher_is_better), "observed", 0.0
    trained = points.steps[-1]
    per_step = points.compute[-1] / trained if trained > 0 and points.unit != "steps" else 1.0
    future_compute = todo * per_step
    f = fit(points, n_eval(run))
    if f.ok:
        future, how = f.at(future_compute), "fit"
    else:
        future, how = np.full(len(todo), float(points.values[-2:].mean())), "flat"
    whole = Curve(np.concatenate([points.steps, todo]), np.concatenate([points.compute, future_compute]),
                  np.concatenate([points.values, future]), points.unit)
    variance = extrapolation_variance(whole, len(points), summary, higher_is_better, n_eval(run),
                                      f.rmse if f.ok else None)
    return summary.of(whole, higher_is_better), how, variance


def extrapolation_variance(whole: Curve, observed: int, summary: Summary, higher_is_better: bool,
                           n_eval: int | None, rmse: float | None) -> float:
    """The variance of a predicted summary's error, as far as the prefix shows it. Each future
    eval will carry its own binomial noise (independent, SE at its predicted level), which the
    smooth extrapolation lacks — without it the seeds' interval of a final-eval forecast covered
    the measured Δ in only ≈ 0.90 of simulated sweeps. And the extrapolated level errs by what
    the prefix's curve does not explain, an error shared by every future point: the prefix
    fit's RMSE beyond the eval noise (`rmse`; its noise part already spreads the seeds'
    forecasts), or one eval SE for a prefix carried flat (`rmse` None: its trend is unknown).
    Both enter through the summary's weights on the future points (its numeric derivative, so
    final, last_k, auc and best are treated alike). A lower bound on the true error: an effect
    that begins after the prefix is in no prefix."""
    future = whole.values[observed:]
    if len(future) == 0:
        return 0.0
    weights = summary_weights(whole, observed, summary, higher_is_better)
    se = np.array([binomial_se(v, n_eval) for v in future])
    level = float(se.max()) if rmse is None else math.sqrt(max(rmse ** 2 - float(np.mean(se ** 2)), 0.0))
    return float(np.sum((weights * se) ** 2) + (np.sum(weights) * level) ** 2)


SUMMARY_STEP = 1e-4     # the perturbation of one eval that measures the summary's weight on it


def summary_weights(whole: Curve, observed: int, summary: Summary, higher_is_better: bool) -> np.ndarray:
    """∂ summary / ∂ value of each future point (those after the first `observed`): 1 on the
    last for final, 1/k on the last k for last_k, the trapezoid's share for auc, 1 on the best
    for best (when it lies in the future)."""
    base = summary.of(whole, higher_is_better)
    weights = []
    for j in range(observed, len(whole)):
        values = whole.values.copy()
        values[j] += SUMMARY_STEP
        weights.append((summary.of(Curve(whole.steps, whole.compute, values, whole.unit), higher_is_better)
                        - base) / SUMMARY_STEP)
    return np.array(weights)


def widen(delta: Estimate, extra_variance: float, level: float = 0.95) -> Estimate:
    """Δ's interval with the variance of the mean Δ's extrapolation error added to the seeds'
    (t at n − 1 df, n the pairs or the smaller arm: never narrower than Welch's)."""
    if not delta.has_ci or extra_variance <= 0:
        return delta
    t = t_quantile(0.5 + level / 2, max(delta.n - 1, 1))
    half = math.sqrt(((delta.high - delta.low) / 2) ** 2 + t * t * extra_variance)
    return Estimate(delta.mean, delta.mean - half, delta.mean + half, delta.n,
                    f"{delta.basis}, with the extrapolation's error")


def predict_section(sweep: Sweep, metric: str, summary: Summary, higher_is_better: bool,
                    fraction: float | None, decide, axis: str = "tokens") -> dict | None:
    """Forecast verdicts: every run's predicted number (completed and running runs), the
    contrasts decided on them by `decide(delta, higher_is_better)` with Δ's interval widened by
    the runs' extrapolation error. None when there is nothing to predict (no fraction asked and
    no run still running)."""
    running = [r for r in sweep.runs if r.state == "running"]
    if fraction is None and not running:
        return None
    use = [r for r in sweep.runs if r.state in ("completed", "running") and metric not in r.nonfinite]
    values, variances, hows = {}, {}, {}
    for r in use:
        value, how, variance = predict_run(r, metric, summary, higher_is_better, fraction, axis)
        if value is not None:
            values.setdefault(r.variant, {})[r.key] = value
            variances.setdefault(r.variant, {})[r.key] = variance
            hows[how] = hows.get(how, 0) + 1
    contrasts = []
    for c in sweep.contrasts:
        with_, without = values.get(c.with_, {}), values.get(c.without, {})
        seeds = delta_ci(with_, without)
        extra = mean_variance(variances.get(c.with_, {}), with_) + mean_variance(
            variances.get(c.without, {}), without)
        delta = widen(seeds, extra)
        verdict, why = decide(delta, higher_is_better)
        contrasts.append({"trick": c.trick, "with": c.with_, "without": c.without, "delta": delta,
                          "seeds_only": seeds, "verdict": verdict, "why": why})
    return {"fraction": fraction, "running": len(running), "runs": sum(len(v) for v in values.values()), "how": hows,
            "values": values, "variances": variances, "contrasts": contrasts}


def mean_variance(variances: dict, used: dict) -> float:
    """The variance that the runs' extrapolation errors add to their mean: Σ var / n²."""
    keys = [k for k in used if k in variances and math.isfinite(used[k])]
    return sum(variances[k] for k in keys) / len(keys) ** 2 if keys else 0.0


def agreement(predictions: dict, verdicts: list[dict], undecided: tuple) -> dict:
    """How the forecasts did against a finished sweep's measured verdicts: on the contrasts the
    measurement decided (its verdict not in `undecided`) apart from the rest, and whether the
    measured Δ lies inside the forecast interval (coverage)."""
    measured = {v["trick"]: v for v in verdicts}
    out = {"decided": [0, 0], "undecided": [0, 0], "covered": [0, 0]}
    for c in predictions["contrasts"]:
        m = measured.get(c["trick"])
        if m is None:
            continue
        row = out["undecided" if m["verdict"] in undecided else "decided"]
        row[0] += m["verdict"] == c["verdict"]
        row[1] += 1
        d, truth = c["delta"], m["delta"].mean
        if d.has_ci and truth is not None:
            out["covered"][0] += d.low <= truth <= d.high
            out["covered"][1] += 1
    return out
