"""Verdicts: what a sweep says about each trick, and about each variant against the controls.

The vocabulary is defined once, here: a new verdict is a name and a colour below and the rule
that gives it, with the reason it gives (`why`); rendering prints whatever it is handed.
Design: docs/statistics.md#the-verdict-vocabulary (each verdict's rule).
"""
from __future__ import annotations

import math


from grpo_ablate.report.activity import activity_of, describe, shows_activity
from grpo_ablate.report.evidence import Evidence
from grpo_ablate.report.health import BREAKING_FLAGS
from grpo_ablate.report.load import Run, Sweep, nested_value
from grpo_ablate.report.metric import Metric
from grpo_ablate.report.power import (contrast_alpha, fixed_power, open_level, power_numbers, sequential_decision,
                                      sequential_guarantee)
from grpo_ablate.rundir.files import TIMING_PREFIXES
from grpo_ablate.stats import group_sequential as seq
from grpo_ablate.stats.error_control import ERROR_CONTROL, adjust
from grpo_ablate.stats.exact import breaking_p
from grpo_ablate.stats.intervals import Estimate, delta_ci
from grpo_ablate.stats.student import t_tail

# --------------------------------------------------------------------------- the vocabulary
HELPS = "helps"
HURTS = "hurts"
NO_EVIDENCE = "no evidence"
BREAKS_TRAINING = "breaks training"
NO_VERDICT = "no verdict"
INERT = "inert here"      # the trick changed nothing in these runs: identical sides, or no activity
NO_EFFECT = "no effect"            # with --effect X: no effect >= X, the interval says so
VERDICT_COLORS = {HELPS: "tab:green", HURTS: "tab:red", NO_EVIDENCE: "tab:gray",   # in the Δ chart
                  BREAKS_TRAINING: "black", NO_VERDICT: "lightgray", INERT: "tab:olive", NO_EFFECT: "tab:blue"}
UNDECIDED = (NO_EVIDENCE, NO_VERDICT)   # what more seeds could still decide

BEATS = "beats"                    # against a control
NOT_SHOWN = "not shown"
NO_COMPARISON = "no comparison"


# --------------------------------------------------------------------------- tricks
def contrast_verdicts(sweep: Sweep, evidence: Evidence, areas: dict, sequential: dict | None = None,
                      effect: float | None = None, power: bool = True) -> list[dict]:
    """One verdict per contrast: {trick, with, without, verdict, delta, auc_delta, why, power, broke}.
    `evidence`: each variant's numbers by seed, how they are tested and which way is better (report/evidence.py);
    `areas`: variant -> {seed: curve mean}; `sequential`: the manifest's looks when they decide
    this report (power.sequential_section). A fixed sweep's tests form one family, adjusted by the
    evidence's error control: Δ = 0 for every contrast that is not inert, and "breaks no more often
    with it" for every contrast in which a run broke."""
    runs_of = {v.name: [r for r in sweep.runs if r.variant == v.name] for v in sweep.variants}
    verdicts = []
    for c in sweep.contrasts:
        if c.with_ not in runs_of or c.without not in runs_of:
            verdicts.append({**c.to_json(), "verdict": NO_VERDICT, "delta": Estimate(), "auc_delta": Estimate(),
                             "why": "a variant of this contrast is not in the sweep", "broke": None,
                             "power": power_numbers(None, effect)})
            continue
        delta = evidence.delta(c.with_, c.without)
        inert = inertness(runs_of[c.with_], runs_of[c.without], c.tested)
        verdicts.append({**c.to_json(), "verdict": INERT if inert else None, "why": inert, "delta": delta,
                         "auc_delta": delta_ci(areas[c.with_], areas[c.without]),
                         "broke": None if inert else broken_counts(runs_of[c.with_], runs_of[c.without])})
    higher_is_better = evidence.metric.higher_is_better
    if sequential is not None:
        for v in verdicts:
            if v["verdict"] is None:
                v["verdict"], v["why"] = (_breaks_training_rule(v["broke"], contrast_alpha(sequential, "trick"))
                                          or decide_by_delta(v["delta"], higher_is_better))
            if v["verdict"] != INERT and "power" not in v:   # an inert trick: more seeds decide nothing
                v["verdict"], v["why"], v["power"] = _sequential_trick(v, sequential, v["verdict"], v["why"], effect,
                                                                      evidence.metric)
            v.setdefault("power", power_numbers(None, effect))
        return verdicts
    family = settle_family(verdicts, evidence, higher_is_better, effect, power)
    for v in verdicts:
        v["family"] = family
    return verdicts


def broken_counts(with_runs: list[Run], without_runs: list[Run]) -> dict:
    """Finished runs and those that broke (diverged, or a breaking health flag) on each side: a
    broken run is an outcome of its variant, counted and tested, never silently dropped."""
    done = lambda runs: [r for r in runs if r.state in ("completed", "diverged")]
    with_done, without_done = done(with_runs), done(without_runs)
    broke_with, broke_without = [r for r in with_done if r.broken], [r for r in without_done if r.broken]
    return {"with": len(broke_with), "with_done": len(with_done), "without": len(broke_without),
            "without_done": len(without_done),
            "how": "; ".join(f"{r.name}: " + ", ".join(f"{f.name}@{f.step}" for f in r.flags
                                                       if f.name in BREAKING_FLAGS) for r in broke_with),
            "p": breaking_p(len(broke_with), len(with_done), len(broke_without), len(without_done))}


def settle_family(verdicts: list[dict], evidence: Evidence, higher_is_better: bool, effect: float | None,
                  power: bool = True) -> dict:
    """Adjust the family's p-values together (Holm or Benjamini–Hochberg at evidence.alpha) and
    give each contrast still open its verdict; returns the family's description."""
    tests = []     # (verdict, kind, p): kind "break" or "delta"
    for v in verdicts:
        if v["verdict"] is not None:
            continue
        if v["broke"] and v["broke"]["p"] is not None:
            tests.append((v, "break", v["broke"]["p"]))
        if v["delta"].p is not None:
            tests.append((v, "delta", v["delta"].p))
    adjusted = adjust([p for _, _, p in tests], evidence.method, evidence.alpha)
    for (v, kind, _), p in zip(tests, adjusted):
        if kind == "break":
            v["broke"]["p_adjusted"] = p
        else:
            v["delta"].p_adjusted = p
    m = len(tests)
    modelled = sum(v["delta"].basis.startswith("blocked") for v in verdicts if v["verdict"] is None)
    family = {"tests": m, "contrasts": len(verdicts), "method": evidence.method, "alpha": evidence.alpha,
              "label": family_label(m, evidence.method, evidence.alpha), "test": evidence.test,
              "model": evidence.describe([(v["with"], v["without"]) for v in verdicts]), "modelled": modelled}
    for v in verdicts:
        if v["verdict"] is None:
            v["verdict"], v["why"] = settle(v, evidence, higher_is_better, effect, family)
    rejected = sum(p is not None and p < evidence.alpha for p in adjusted)
    family["open_level"] = open_level(evidence.method, evidence.alpha, m, rejected)
    for v in verdicts:
        v["power"] = fixed_power(v["delta"], family["open_level"], effect, v["verdict"] not in UNDECIDED, power)
    return family


def family_label(tests: int, method: str, alpha: float) -> str:
    """"6 tests, Holm, 5%": what the headline says the error control was."""
    return f"{tests} test{'s' if tests != 1 else ''}, {ERROR_CONTROL[method]}, {100 * alpha:g}%"


def _pfmt(p: float | None) -> str:
    return "—" if p is None else f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"


def settle(v: dict, evidence: Evidence, higher_is_better: bool, effect: float | None, family: dict) -> tuple[str, str]:
    """A contrast's verdict once its family's p-values are adjusted: *breaks training* when its runs
    broke more often with the trick (exact test, adjusted); else *helps* / *hurts* when Δ's adjusted
    p is below alpha; *no verdict* without a test, or when the seeds agree within one eval problem."""
    broke, delta, alpha = v["broke"], v["delta"], evidence.alpha
    adjusted = evidence.method != "none"
    counts = (f"runs that broke: {broke['with']} of {broke['with_done']} with it, {broke['without']} of "
              f"{broke['without_done']} without" if broke and broke["with"] + broke["without"] else "")
    if broke and broke.get("p_adjusted") is not None and broke["p_adjusted"] < alpha:
        return BREAKS_TRAINING, (f"{counts} ({broke['how']}): exact test p = {_pfmt(broke['p'])}"
                                 + (f", adjusted {_pfmt(broke['p_adjusted'])}" if adjusted else "")
                                 + f" < {alpha:g} ({family['label']})")
    with_counts = f" ({counts})" if counts else ""
    if delta.mean is None:
        return NO_VERDICT, "no completed runs on one side to compare" + with_counts
    if not delta.has_ci:
        if delta.n <= 1 and "Welch" not in delta.basis:
            return NO_VERDICT, f"one seed: no interval, no test{with_counts}"
        return NO_VERDICT, f"too few completed runs for an interval ({delta.basis}){with_counts}"
    if delta.zero_spread:
        return NO_VERDICT, ("every seed gave the same Δ, so the interval has zero width: no spread to test "
                            f"against (a coarse metric? more eval problems or seeds){with_counts}")
    g = evidence.granularity
    if g is not None and delta.high - delta.low < g * (1 - 1e-9):
        return NO_VERDICT, (f"the interval is narrower than one eval problem ({g:.3g}): the seeds agree to "
                            f"within the eval's granularity, which is not a measure of noise{with_counts}")
    p_used = delta.p_adjusted if delta.p_adjusted is not None else delta.p
    ps = f"p = {_pfmt(delta.p)}" + (f", adjusted {_pfmt(delta.p_adjusted)}" if adjusted else "")
    if p_used < alpha:
        better = (delta.mean > 0) == higher_is_better
        return (HELPS if better else HURTS), f"{ps} < {alpha:g} ({family['label']}){with_counts}"
    excludes = not (delta.low <= 0.0 <= delta.high)
    why = (f"{ps} ≥ {alpha:g} ({family['label']})"
           + ("; the unadjusted 95% CI excludes zero, but one of several tests is expected to by chance"
              if excludes and adjusted else ""))
    if effect is not None:   # no effect ≥ X: the Bonferroni interval of the family inside ±X (two one-sided tests)
        m = max(1, family["tests"])
        wide = delta.interval(1 - alpha / m) if adjusted else delta.interval(1 - alpha)
        if wide is not None and -effect < wide[0] and wide[1] < effect:
            level = 100 * (1 - alpha / m) if adjusted else 100 * (1 - alpha)
            return NO_EFFECT, (f"its {level:.4g}% CI (Bonferroni over the family) [{wide[0]:+.3f}, {wide[1]:+.3f}] "
                               f"lies inside ±{effect:g}: no effect ≥ {effect:g}{with_counts}")
    return NO_EVIDENCE, why + with_counts


def _breaks_training_rule(broke: dict | None, alpha: float = seq.ALPHA) -> tuple[str, str] | None:
    """*breaks training* outside a fixed report's family: the exact test at `alpha` (a sequential
    sweep's per-contrast share of its level)."""
    if broke and broke["p"] is not None and broke["p"] < alpha:
        return BREAKS_TRAINING, (f"runs that broke: {broke['with']} of {broke['with_done']} with it, "
                                 f"{broke['without']} of {broke['without_done']} without ({broke['how']}): "
                                 f"exact test p = {_pfmt(broke['p'])}")
    return None


def _sequential_trick(c: dict, section: dict, verdict: str, why: str, effect: float | None,
                      metric: Metric) -> tuple[str, str, dict]:
    """A trick of a sequential sweep: the looks decide (two-sided); breaking training first."""
    found = sequential_decision(section, c["trick"], effect, True, metric)
    if found is None:
        power = {**power_numbers(None, effect), "look": None, "sequential": True}
        return (verdict, why, power) if verdict == BREAKS_TRAINING else (
            NO_VERDICT, "the sequential sweep recorded no look of this contrast yet", power)
    d, last = found
    x = effect if effect is not None else section.get("effect")
    power = {**power_numbers(last, x, critical=d.boundary), "look": d.look, "sequential": True,
             "boundary": d.boundary, "t": d.t, "alpha_spent": d.alpha_spent, "final": d.final,
             "replanned": d.replanned, "rci": list(d.rci)}
    if verdict == BREAKS_TRAINING:
        return verdict, why, {**power, "look": None}
    at = f"at look {d.look} ({d.n} seeds)"
    replanned = " (re-planned after its maximum was raised: about 7% false helps/hurts, not 5%)" if d.replanned else ""
    if d.outcome in (seq.POSITIVE, seq.NEGATIVE):
        better = (d.outcome == seq.POSITIVE) == metric.higher_is_better
        why = (f"crossed the sequential boundary {at}: t = {d.t:+.2f}, boundary ±{d.boundary:.2f}; "
               f"{sequential_guarantee(section)}{replanned}")
        return (HELPS if better else HURTS), why, power
    if d.outcome == seq.EQUIVALENT:
        return NO_EFFECT, (f"its repeated 95% interval [{d.rci[0]:+.3f}, {d.rci[1]:+.3f}] {at} lies "
                           f"inside ±{x:g}: no effect ≥ {x:g}{replanned}"), power
    if not math.isfinite(d.t) or not math.isfinite(d.boundary):
        return NO_VERDICT, f"no test at {d.n} seeds (too few, or no spread)", power
    if last.sd == 0.0 and last.mean != 0.0:    # as the fixed rule: a coarse metric, not certainty
        return NO_VERDICT, ("every seed gave the same nonzero Δ, so there is no spread to test against "
                            "(a coarse metric? more eval problems)"), power
    cap = "; the maximum: its alpha is spent" if d.final else ""
    return NO_EVIDENCE, (f"undecided after {d.n} seeds (sequential): t = {d.t:+.2f} inside ±{d.boundary:.2f}"
                         f"{cap}{replanned}"), power


def decide(with_runs: list[Run], without_runs: list[Run], delta: Estimate, higher_is_better: bool,
           trick: str | None = None) -> tuple[str, str]:
    """One trick's verdict on its own, without a family (the sequential launcher's check of each
    contrast as its runs land): *inert here* when the trick changed nothing (`inertness`);
    *breaks training* when its runs broke more often than those without it (exact test at 5%);
    else the CI of Δ (`decide_by_delta`)."""
    reason = inertness(with_runs, without_runs, trick)
    if reason is not None:
        return INERT, reason
    broke = broken_counts(with_runs, without_runs)
    return _breaks_training_rule(broke) or decide_by_delta(delta, higher_is_better)


def inertness(with_runs: list[Run], without_runs: list[Run], trick: str | None) -> str | None:
    """Why the trick changed nothing in these runs, or None: the two sides logged identical
    metrics (timings aside) and ended the same way at every shared seed, or the trick's own activity metric
    (report/activity.py) showed no activity in any finished run that had it on."""
    done = lambda runs: {r.key: r for r in runs if r.state in ("completed", "diverged")}
    with_done, without_done = done(with_runs), done(without_runs)
    shared = sorted(set(with_done) & set(without_done), key=str)
    same = lambda a, b: a.state == b.state and same_metrics(a, b)      # a run that diverged changed something
    if shared and all(same(with_done[k], without_done[k]) for k in shared):
        return (f"the two sides logged identical metrics at every shared seed ({', '.join(map(str, shared))}): "
                "the trick changed nothing here")
    info = next((nested_value(r.config, "tricks", trick) for r in with_done.values() if trick), None)
    entry = activity_of(info.get("family"), info.get("option")) if isinstance(info, dict) else None
    runs = [r for r in with_done.values() if entry and entry[0] in r.metrics]
    if runs and not any(shows_activity(r.metrics.loc[r.metrics["step"] >= 1, entry[0]].tolist(), *entry[1:])
                        for r in runs):
        return f"its activity metric showed none: {describe(*entry)} in every run with it ({len(runs)})"
    return None


def same_metrics(a: Run, b: Run) -> bool:
    """The same logged metrics, step for step (timings aside)."""
    keep = lambda frame: frame[[c for c in frame.columns if not c.startswith(TIMING_PREFIXES)]]
    left, right = keep(a.metrics), keep(b.metrics)
    return (list(left.columns) == list(right.columns) and left.shape == right.shape
            and bool((left.astype(object).fillna("nan").values == right.astype(object).fillna("nan").values).all()))


def decide_by_delta(delta: Estimate, higher_is_better: bool) -> tuple[str, str]:
    if delta.mean is None:
        return NO_VERDICT, "no completed runs on one side to compare"
    if not delta.has_ci:
        if delta.n <= 1 and "Welch" not in delta.basis:
            return NO_VERDICT, f"one seed: only *{BREAKS_TRAINING}* can be called"
        return NO_VERDICT, f"too few completed runs for an interval ({delta.basis})"
    if delta.low <= 0.0 <= delta.high:
        return NO_EVIDENCE, "the 95% CI of Δ spans zero"
    if delta.low == delta.high or delta.zero_spread:  # every seed gave the same Δ: a coarse metric, not certainty
        return NO_VERDICT, ("every seed gave the same nonzero Δ, so the interval has zero width and says "
                            "nothing about noise (a coarse metric? more eval problems or seeds)")
    better = (delta.low > 0) == higher_is_better
    return (HELPS if better else HURTS), "the 95% CI of Δ excludes zero"


# --------------------------------------------------------------------------- controls
def against_controls(sweep: Sweep, evidence: Evidence, sequential: dict | None = None) -> list[dict]:
    """Every treatment against every control the sweep has: {variant, control, role, delta,
    outcome, beats, why, family}; a sequential sweep's looks decide (one-sided). A fixed sweep's
    comparisons are a family of their own (one-sided tests of *beats*, adjusted together by the
    evidence's error control), apart from the trick contrasts: the report says so."""
    against = []
    for v in sweep.variants:
        if v.kind == "control":
            continue
        for role in sweep.controls:
            control = sweep.control_of(v.context, role)   # its own context's, in a sweep across contexts
            if control is None:
                continue
            delta = evidence.delta(v.name, control)
            against.append({"variant": v.name, "control": control, "role": role, "delta": delta})
    sign = evidence.metric.sign
    one_sided = [None if c["delta"].p is None or not c["delta"].se else
                 2.0 * t_tail(sign * c["delta"].mean / c["delta"].se, c["delta"].df) for c in against]
    adjusted = adjust([None if p is None else min(1.0, p) for p in one_sided], evidence.method, evidence.alpha)
    tested = sum(p is not None for p in one_sided)
    family = {"tests": tested, "method": evidence.method, "alpha": evidence.alpha,
              "label": family_label(tested, evidence.method, evidence.alpha), "test": evidence.test,
              "model": evidence.describe([(c["variant"], c["control"]) for c in against])}
    for c, p, p_adj in zip(against, one_sided, adjusted):
        c["p_beats"], c["p_beats_adjusted"], c["family"] = p, p_adj, family
        outcome, beats, why = compare_with_control(c["delta"], evidence.values.get(c["control"], {}),
                                                   evidence.metric, p_adj, family)
        if sequential is not None and outcome != NO_COMPARISON:
            outcome, beats, why = _sequential_control(sequential, f"{c['variant']} vs {c['control']}",
                                                      evidence.metric)
        c.update(outcome=outcome, beats=beats, why=why)
    return against


def _sequential_control(section: dict, name: str, metric: Metric) -> tuple[str, bool | None, str]:
    found = sequential_decision(section, name, None, False, metric)
    if found is None:
        return NOT_SHOWN, None, "the sequential sweep recorded no look of this comparison yet"
    d, _ = found
    where = f"at look {d.look} ({d.n} seeds): t = {d.t:+.2f}, boundary {d.boundary:.2f}"
    if d.outcome == seq.POSITIVE:
        return BEATS, True, f"crossed the one-sided sequential boundary {where}"
    if d.outcome == seq.NEGATIVE:
        return NOT_SHOWN, False, f"it is worse: crossed the lower sequential boundary {where}"
    if not math.isfinite(d.t) or not math.isfinite(d.boundary):
        return NOT_SHOWN, None, f"no test at {d.n} seeds (too few, or no spread)"
    return NOT_SHOWN, False, f"undecided after {d.n} seeds (sequential): t = {d.t:+.2f} below {d.boundary:.2f}"


def compare_with_control(delta: Estimate, control: dict, metric: Metric, p_adjusted: float | None = None,
                         family: dict | None = None) -> tuple[str, bool | None, str]:
    """Whether a variant beats a control (Δ = variant − control; `control` is the control's
    values keyed by seed): (outcome, beats, why).
    outcome: *beats* only when the one-sided test of "better" rejects at alpha / 2 after the
    family's adjustment (`p_adjusted`, the one-sided p doubled; without a family: the 95% CI of Δ
    lies entirely on the better side of zero); *not shown* when it does not, or when no test is
    possible (one seed, too few runs, no completed run of the variant); *no comparison* when the
    control itself has nothing to compare with (then no claim is made either way).
    beats: True / False when a test decided, None when none could."""
    if not any(v is not None for v in control.values()):
        return NO_COMPARISON, None, ("the control has no completed run" if not control
                                     else "the control's runs did not log this metric")
    if delta.mean is None:
        return NOT_SHOWN, None, "no completed run of this variant to compare"
    if not delta.has_ci:
        if delta.n <= 1 and "Welch" not in delta.basis:
            return NOT_SHOWN, None, "one seed: no comparison is possible beyond the point estimate"
        return NOT_SHOWN, None, f"too few completed runs for an interval ({delta.basis})"
    if (delta.low == delta.high or delta.zero_spread) and delta.mean != 0.0:   # a coarse metric, not certainty
        return NOT_SHOWN, False, "every seed gave the same Δ: a zero-width interval says nothing about noise"
    better_side = metric.better(delta.mean)
    up = metric.higher_is_better
    if family is not None and p_adjusted is not None:
        ps = (f"one-sided p = {_pfmt(p_adjusted / 2)}" if family["method"] == "none"
              else f"one-sided p ×2, adjusted = {_pfmt(p_adjusted)}")
        if better_side and p_adjusted < family["alpha"]:
            return BEATS, True, f"{ps} < {family['alpha']:g} ({family['label']})"
        if (delta.high < 0) if up else (delta.low > 0):
            side = "below" if up else "above"
            return NOT_SHOWN, False, f"it is worse: the unadjusted 95% CI of Δ lies entirely {side} zero"
        return NOT_SHOWN, False, f"{ps} ≥ {family['alpha']:g} ({family['label']})"
    if (delta.low > 0) if up else (delta.high < 0):
        return BEATS, True, f"the 95% CI of Δ lies entirely {'above' if up else 'below'} zero"
    if (delta.high < 0) if up else (delta.low > 0):
        side = "below" if up else "above"
        return NOT_SHOWN, False, f"it is worse: the 95% CI of Δ lies entirely {side} zero"
    return NOT_SHOWN, False, "the 95% CI of Δ spans zero"
