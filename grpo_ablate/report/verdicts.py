"""Verdicts: what a sweep says about each trick, and about each variant against the controls.

The vocabulary is defined once, here: a new verdict is a name and a colour below and the rule
in `decide` that gives it, with the reason it gives (`why`). Rendering prints whatever
verdict and reason it is handed.

- A trick is *inert here* when it changed nothing: its two sides logged identical metrics
  at every shared seed, or its own activity metric (report/activity.py: a clip fraction, the
  masked fraction of overlong filtering, an adaptive coefficient that never moved ...) showed
  no activity in any run that had it. Never *no evidence*: there was nothing to measure.
- A trick (a contrast: the variant with it vs the one without) *breaks training* when at
  least half of its finished runs broke (diverged or a breaking health flag) and none without
  it did. Otherwise the 95% CI of Δ decides: *helps* / *hurts* when it excludes zero, *no
  evidence* when it touches zero, *no verdict* when there is no interval (one seed, too few
  runs) or a zero-width one (every seed gave the same Δ: a coarse metric, not certainty).
  With `--effect X`, a contrast whose 95% CI lies inside ±X is *no effect* (no effect ≥ X).
- A variant *beats* a control only when the 95% CI of Δ = variant − control lies entirely on
  the better side of zero; otherwise it is *not shown* to; *no comparison* when the control
  itself has nothing to compare with.
- A sequential sweep (`sweep --seeds auto`) is decided by its looks instead (power.py): the
  group-sequential boundaries, two-sided for tricks, one-sided for *beats*; *breaks training*
  still comes first.
"""
from __future__ import annotations

import math

from grpo_ablate.report import sequential as seq
from grpo_ablate.report.activity import ACTIVITY, describe, shows_activity
from grpo_ablate.report.health import BREAKING_FLAGS
from grpo_ablate.report.load import Run, Sweep, nested_value
from grpo_ablate.report.power import power_numbers, sequential_decision
from grpo_ablate.report.stats import Estimate, delta_ci
from grpo_ablate.rundir import TIMING_PREFIXES

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
def contrast_verdicts(sweep: Sweep, finals: dict, areas: dict, higher_is_better: bool,
                      sequential: dict | None = None, effect: float | None = None) -> list[dict]:
    """One verdict per contrast: {trick, with, without, verdict, delta, auc_delta, why, power}.
    `finals` / `areas`: variant -> {seed: final value / curve mean} of its completed runs;
    `sequential`: the manifest's looks when they decide this report (power.sequential_section)."""
    runs_of = {v["name"]: [r for r in sweep.runs if r.variant == v["name"]] for v in sweep.variants}
    verdicts = []
    for c in sweep.contrasts:
        if c["with"] not in runs_of or c["without"] not in runs_of:
            verdicts.append({**c, "verdict": NO_VERDICT, "delta": Estimate(), "auc_delta": Estimate(),
                             "why": "a variant of this contrast is not in the sweep",
                             "power": power_numbers(None, effect)})
            continue
        delta = delta_ci(finals[c["with"]], finals[c["without"]])
        verdict, why = decide(runs_of[c["with"]], runs_of[c["without"]], delta, higher_is_better,
                              c.get("tests", c["trick"]))
        if sequential is not None and verdict != INERT:   # an inert trick: more seeds decide nothing
            verdict, why, power = _sequential_trick(c, sequential, verdict, why, effect, higher_is_better)
        else:
            verdict, why = _no_effect(verdict, why, delta, effect)
            look = seq.paired_look(finals[c["with"]], finals[c["without"]], 0)
            power = {**power_numbers(look, effect), "look": 1 if verdict not in UNDECIDED else None,
                     "sequential": False}
        verdicts.append({**c, "verdict": verdict, "delta": delta,
                         "auc_delta": delta_ci(areas[c["with"]], areas[c["without"]]), "why": why, "power": power})
    return verdicts


def _no_effect(verdict: str, why: str, delta: Estimate, effect: float | None) -> tuple[str, str]:
    """With --effect X a fixed sweep's CI inside ±X says no effect ≥ X (two one-sided tests)."""
    if verdict == NO_EVIDENCE and effect is not None and delta.has_ci and -effect < delta.low and delta.high < effect:
        return NO_EFFECT, f"the 95% CI of Δ lies inside ±{effect:g}: no effect ≥ {effect:g}"
    return verdict, why


def _sequential_trick(c: dict, section: dict, verdict: str, why: str, effect: float | None,
                      higher_is_better: bool) -> tuple[str, str, dict]:
    """A trick of a sequential sweep: the looks decide (two-sided); breaking training first."""
    found = sequential_decision(section, c["trick"], effect, True, higher_is_better)
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
        better = (d.outcome == seq.POSITIVE) == higher_is_better
        why = (f"crossed the sequential boundary {at}: t = {d.t:+.2f}, boundary ±{d.boundary:.2f}; "
               f"false helps/hurts ≤ 5% over all looks{replanned}")
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
    """The verdict on one trick and why. *inert here*: the trick changed nothing (see
    `inertness`), whatever the numbers say. *breaks training*: at least half of the finished
    runs with it broke (diverged or a breaking health flag) and none without it did. Else
    the CI of Δ decides; a CI that touches zero is *no evidence*, never a difference, and a
    zero-width CI (every seed gave the same Δ) decides nothing."""
    reason = inertness(with_runs, without_runs, trick)
    if reason is not None:
        return INERT, reason
    with_done = [r for r in with_runs if r.state in ("completed", "diverged")]
    without_done = [r for r in without_runs if r.state in ("completed", "diverged")]
    broke_with = [r for r in with_done if r.broken]
    broke_without = [r for r in without_done if r.broken]
    if broke_with and without_done and not broke_without and 2 * len(broke_with) >= len(with_done):
        how = "; ".join(f"{r.name}: " + ", ".join(f"{f.name}@{f.step}" for f in r.flags if f.name in BREAKING_FLAGS)
                        for r in broke_with)
        return BREAKS_TRAINING, (f"{len(broke_with)} of {len(with_done)} runs with it broke ({how}); "
                                 f"0 of {len(without_done)} without it")
    verdict, why = decide_by_delta(delta, higher_is_better)
    if broke_without or broke_with:  # the numbers are only part of the story then
        why += (f" (runs that broke: {len(broke_with)} of {len(with_done)} with it, "
                f"{len(broke_without)} of {len(without_done)} without)")
    return verdict, why


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
    entry = ACTIVITY.get((info.get("family"), info.get("option"))) if isinstance(info, dict) else None
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
    if delta.low == delta.high:  # every seed gave the same Δ: a coarse metric, not certainty
        return NO_VERDICT, ("every seed gave the same nonzero Δ, so the interval has zero width and says "
                            "nothing about noise (a coarse metric? more eval problems or seeds)")
    better = (delta.low > 0) == higher_is_better
    return (HELPS if better else HURTS), "the 95% CI of Δ excludes zero"


# --------------------------------------------------------------------------- controls
def against_controls(sweep: Sweep, finals: dict, higher_is_better: bool, sequential: dict | None = None) -> list[dict]:
    """Every treatment against every control the sweep has: {variant, control, role, delta,
    outcome, beats, why}; a sequential sweep's looks decide (one-sided)."""
    against = []
    for v in sweep.variants:
        if v["kind"] == "control":
            continue
        for role, control in sweep.controls.items():
            delta = delta_ci(finals[v["name"]], finals[control])
            outcome, beats, why = compare_with_control(delta, finals[control], higher_is_better)
            if sequential is not None and outcome != NO_COMPARISON:
                outcome, beats, why = _sequential_control(sequential, f"{v['name']} vs {control}", higher_is_better)
            against.append({"variant": v["name"], "control": control, "role": role, "delta": delta,
                            "outcome": outcome, "beats": beats, "why": why})
    return against


def _sequential_control(section: dict, name: str, higher_is_better: bool) -> tuple[str, bool | None, str]:
    found = sequential_decision(section, name, None, False, higher_is_better)
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


def compare_with_control(delta: Estimate, control: dict, higher_is_better: bool) -> tuple[str, bool | None, str]:
    """Whether a variant beats a control (Δ = variant − control; `control` is the control's
    final values keyed by seed): (outcome, beats, why).
    outcome: *beats* only when the 95% CI of Δ lies entirely on the better side of zero;
    *not shown* when it does not, or when no interval is possible (one seed, too few runs, no
    completed run of the variant): it has not shown that it beats the control; *no comparison*
    when the control itself has nothing to compare with (then no claim is made either way).
    beats: True / False when an interval decided, None when none could."""
    if not any(v is not None for v in control.values()):
        return NO_COMPARISON, None, ("the control has no completed run" if not control
                                     else "the control's runs did not log this metric")
    if delta.mean is None:
        return NOT_SHOWN, None, "no completed run of this variant to compare"
    if not delta.has_ci:
        if delta.n <= 1 and "Welch" not in delta.basis:
            return NOT_SHOWN, None, "one seed: no comparison is possible beyond the point estimate"
        return NOT_SHOWN, None, f"too few completed runs for an interval ({delta.basis})"
    if delta.low == delta.high and delta.low != 0.0:   # as in decide_by_delta: a coarse metric, not certainty
        return NOT_SHOWN, False, "every seed gave the same Δ: a zero-width interval says nothing about noise"
    if (delta.low > 0) if higher_is_better else (delta.high < 0):
        return BEATS, True, f"the 95% CI of Δ lies entirely {'above' if higher_is_better else 'below'} zero"
    if (delta.high < 0) if higher_is_better else (delta.low > 0):
        side = "below" if higher_is_better else "above"
        return NOT_SHOWN, False, f"it is worse: the 95% CI of Δ lies entirely {side} zero"
    return NOT_SHOWN, False, "the 95% CI of Δ spans zero"
