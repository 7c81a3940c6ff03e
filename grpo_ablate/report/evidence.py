"""What a report's tests are run on: each run's number (its summary of the metric), the grid
those numbers lie on, and the per-problem scores behind them, gathered once so that every
contrast, control comparison and summary is tested the same way (stats/intervals.py).

- The grid: `eval/accuracy` is a count over the eval set, c / (N n) with n samples per problem; its
  final value lies on 1/(N n) and the mean of the last k evals on 1/(N n k). pass@k and maj@k
  (k < n), other metrics and summaries have none.
- The per-problem scores: evals.jsonl holds every eval's scores; a run's per-problem values of the
  compared metric (avg@n, pass@k, maj@k: evals/scores.py) are those of its last eval (final) or
  their mean over its last k evals (last_k), the same evals its number came from. Other summaries
  (auc, best) are not a fixed average of evals (best picks one by its own value): there the test
  counts seeds only, and the report says so. Runs are paired on problems only when every one of
  them was scored on the same eval set (the fingerprint of its prompts).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from grpo_ablate.evals.protocol import ACCURACY, parse_metric
from grpo_ablate.evals.scores import paired_sampling_variance
from grpo_ablate.report.curves import Curve, Summary
from grpo_ablate.report.load import nested_value
from grpo_ablate.report.metric import Metric
from grpo_ablate.stats.blocked import blocked_delta, fit_star, stars
from grpo_ablate.stats.error_control import ALPHA
from grpo_ablate.stats.intervals import Estimate, delta_ci

PAIRED = "paired t per contrast"     # how a contrast outside any fitted star is tested


@dataclass
class Evidence:
    """variant -> {seed: number}, the grid of the numbers, variant -> {seed: per-problem scores},
    the error control of the report (method, alpha), the metric the numbers are of (which way
    is better), and the test: `blocked` fits each star family of contrasts (one shared arm) as a
    block design (stats/blocked.py) once `model` has been given the family; `paired` tests each
    contrast on its own paired differences."""
    values: dict
    granularity: float | None = None
    scores: dict = field(default_factory=dict)
    method: str = "holm"
    alpha: float = ALPHA
    why_no_scores: str | None = None     # why the eval set's noise is not in the intervals, when it is not
    metric: Metric = Metric()
    test: str = "blocked"
    fits: dict = field(default_factory=dict)        # hub -> BlockedFit of its star
    star_of: dict = field(default_factory=dict)     # (with, without) -> the hub whose fit tests it
    draws: dict = field(default_factory=dict)       # variant -> {seed: the evals its avg@n averages} (n >= 2)

    def model(self, pairs: list[tuple[str, str]]) -> None:
        """Fit the star families among a family's contrasts (with, without) as block designs (with the
        blocked test); every later `delta` of one of their pairs is the model's."""
        if self.test != "blocked":
            return
        for hub, leaves in stars(pairs).items():
            fit = fit_star(self.values, hub, leaves, self.granularity)
            if fit is None:
                continue
            self.fits[hub] = fit
            for a, b in pairs:
                if (a == hub and fit.tests(b)) or (b == hub and fit.tests(a)):
                    self.star_of[(a, b)] = hub

    def fit_of(self, a: str, b: str) -> str | None:
        """The hub of the fitted star that (a, b) is a contrast of, tested by it or left paired by it (a
        leaf with the same Δ at every seed, a star whose model does not hold); None for any other pair."""
        for hub, fit in self.fits.items():
            if hub in (a, b) and ({a, b} - {hub}) & (set(fit.leaves) | set(fit.left_out)):
                return hub
        return None

    def describe(self, pairs: list[tuple[str, str]]) -> str:
        """How a family's contrasts were tested, in one line: the blocked model(s) and what they
        borrowed, the contrasts left paired (not in a star, or a side missing a block)."""
        member = [self.fit_of(a, b) for a, b in pairs]
        fits = [self.fits[h] for h in dict.fromkeys(h for h in member if h is not None)]
        paired = sum(h is None for h in member)
        if not fits:
            why = "" if self.test == "paired" else " (no star of contrasts with a shared arm complete on two seeds)"
            return f"{PAIRED}{why}"
        text = "; ".join(f.describe() for f in fits)
        return text + (f"; {paired} contrast{'s' * (paired != 1)} paired (a side misses a block, or no shared "
                       "arm)" if paired else "")

    def delta(self, with_: str, without: str) -> Estimate:
        """Δ = with − without: the blocked model's where a fitted star holds the pair, else paired on
        seeds; on the grid, with the eval-noise term where both sides have the per-problem scores of
        every seed tested."""
        a, b = self.values.get(with_, {}), self.values.get(without, {})
        sa, sb = self.scores.get(with_, {}), self.scores.get(without, {})
        shared = set(a) & set(b)
        problems = {s: (sa[s], sb[s]) for s in shared if s in sa and s in sb}
        # either order: a contrast (with, without), or a variants-table row's Δ vs its reference
        hub = self.star_of.get((with_, without)) or self.star_of.get((without, with_))
        sampling = self.sampling(with_, without, shared)
        if hub is not None:
            return blocked_delta(self.fits[hub], with_, without, self.values, self.granularity, problems or None,
                                 sampling=sampling)
        return delta_ci(a, b, granularity=self.granularity,
                        problems=problems if problems and len(problems) == len(shared) else None, sampling=sampling)

    def sampling(self, with_: str, without: str, seeds) -> dict | None:
        """seed -> the variance of its Δ over the draw of the eval's samples (the within-problem term:
        evals/scores.paired_sampling_variance), where both sides drew n >= 2 samples a problem."""
        a, b = self.draws.get(with_, {}), self.draws.get(without, {})
        found = {s: paired_sampling_variance(a[s], b[s]) for s in seeds if s in a and s in b}
        return found if found and all(v is not None for v in found.values()) else None


def gather(values: dict, runs_of: dict, curves: dict, metric: Metric, summary: Summary, method: str = "holm",
           alpha: float = ALPHA, test: str = "blocked") -> Evidence:
    """The Evidence of a report: `values` variant -> {seed: number}; `runs_of` variant -> runs;
    `curves` variant -> {seed: Curve} of the runs the numbers came from."""
    evidence = Evidence(values, method=method, alpha=alpha, metric=metric, test=test)
    if parse_metric(metric.name) is None:
        evidence.why_no_scores = f"`{metric.name}` is not broken down by problem (only the eval's metrics are)"
        return evidence
    if summary.how not in ("final", "last_k"):
        evidence.why_no_scores = f"the {summary.label} of a curve is not a fixed average of its evals"
    scores, sets, grids, lacking = {}, {}, set(), []
    for name, points in curves.items():
        by_seed = {r.key: r for r in runs_of.get(name, [])}
        for seed, c in points.items():
            run = by_seed.get(seed)
            row = _summary_scores(run.evals, c, summary, metric.name) if run is not None else None
            if row is None:
                lacking.append(run.run_dir.name if run is not None else f"{name} seed {seed}")
                continue
            fingerprint, s, grid, rows = row
            # one name, other sizes (a file of another version): another set
            sets.setdefault((fingerprint, len(s)), []).append(run.run_dir.name)
            grids.add(grid)
            scores.setdefault(name, {})[seed] = s
            if parse_metric(metric.name)[0] == "avg":
                evidence.draws.setdefault(name, {})[seed] = rows
    if not grids and metric.name == ACCURACY:   # runs from before evals.jsonl: the configured eval size gives the grid
        grids = {nested_value(r.config, "task", "eval_size") for runs in runs_of.values() for r in runs
                 if r.state == "completed"}
    if len(grids) == 1 and summary.how in ("final", "last_k"):
        n = grids.pop()
        if isinstance(n, int) and n > 0:
            evidence.granularity = 1.0 / (n * (summary.k if summary.how == "last_k" else 1))
    if evidence.why_no_scores is None:
        if len(sets) > 1:
            evidence.why_no_scores = "the runs were scored on different eval sets (" + "; ".join(
                f"{name} of {size} problems: {_some(runs)}" for (name, size), runs in sets.items()) + ")"
        elif not scores:
            evidence.why_no_scores = "no run logged per-problem scores (evals.jsonl; runs of older versions wrote none)"
        elif lacking:   # all or none: a contrast half counted by problem would claim a precision it lacks
            evidence.why_no_scores = (f"the per-problem scores of {_some(lacking)} are missing, damaged or not of "
                                      "this metric (evals.jsonl: see the runs' notes)")
        else:
            evidence.scores = scores
    if not evidence.scores:
        evidence.draws = {}
    return evidence


def _some(names: list[str], shown: int = 3) -> str:
    """A few names and how many more: 'a, b, c and 2 more'."""
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _summary_scores(evals: dict, points: Curve, summary: Summary,
                    metric: str) -> tuple[str, np.ndarray, int | None, list] | None:
    """(eval set, per-problem values, the grid's units per 1: problems x samples for avg@n, None for
    pass@k and maj@k; the evals averaged) whose mean is the run's summary of `metric`; None where
    evals.jsonl lacks one of the evals it averages, or holds no values of this metric."""
    if not len(points) or summary.how not in ("final", "last_k"):
        return None
    steps = points.steps[-1:] if summary.how == "final" else points.steps[-summary.k:]
    rows = [evals.get(int(s)) for s in steps]
    if any(r is None for r in rows) or len({r.set for r in rows}) != 1 or len({r.problems for r in rows}) != 1:
        return None
    per_problem = [r.metric(metric) for r in rows]
    if any(p is None for p in per_problem):
        return None
    scores = np.mean(per_problem, axis=0)
    value = points.values[-1] if summary.how == "final" else points.values[-summary.k:].mean()
    if abs(float(scores.mean()) - float(value)) > 1e-6:    # not the scores of this number (another metric?)
        return None
    kind, k = parse_metric(metric)
    samples = {r.samples for r in rows}
    grid = rows[0].problems * samples.pop() if kind == "avg" and len(samples) == 1 else None
    return rows[0].set, scores, grid, rows
