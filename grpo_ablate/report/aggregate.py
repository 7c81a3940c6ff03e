"""Aggregate scores over runs and tasks (rliable: Agarwal et al. 2021, "Deep RL at the Edge of
the Statistical Precipice"), computed with scipy rather than re-derived.

- IQM, the interquartile mean: the mean of the middle 50% of all runs × tasks scores
  (`scipy.stats.trim_mean(x, 0.25)`): robust to one odd seed, more efficient than the median.
- Stratified bootstrap confidence intervals: runs are resampled within each task, never across
  (`scipy.stats.bootstrap` with one sample per task resamples each independently: that is the
  stratification), percentile intervals as rliable's `get_interval_estimates(method="percentile")`.
- Probability of improvement P(X > Y): per task the Mann–Whitney U of X's runs against Y's over
  n·m (ties count a half; `scipy.stats.mannwhitneyu`), averaged over tasks; its interval by the
  same stratified bootstrap over both sides.

A "task" is whatever the scores are stratified by: in a sweep of one context, that one context
(the seeds are the runs); across contexts, each context.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from grpo_ablate.report.stats import Estimate

REPS = 2000           # bootstrap resamples (rliable's default is 50,000; the percentile CI is stable well before)
SEED = 0              # the bootstrap's generator: a report is the same every time it is built


def iqm(scores, axis=-1):
    """The interquartile mean over the last axis (scores of all runs and tasks, flattened)."""
    from scipy import stats   # here, not at the top: scipy.stats costs ~0.7 s to import (report/stats.py)

    return stats.trim_mean(scores, 0.25, axis=axis)


def _tasks(scores: dict) -> list[np.ndarray]:
    return [np.asarray(v, float) for v in scores.values() if len(v)]


def aggregate_iqm(scores: dict, level: float = 0.95, reps: int = REPS) -> Estimate:
    """IQM over every task's runs (task -> scores), with a stratified bootstrap interval."""
    tasks = _tasks(scores)
    if not tasks:
        return Estimate()
    point = float(iqm(np.concatenate(tasks)))
    n = sum(len(t) for t in tasks)
    if any(len(t) < 2 for t in tasks) or all(np.all(t == t[0]) for t in tasks):
        return Estimate(point, None, None, n, "IQM, too few runs (or no spread) for a bootstrap")
    stat = lambda *samples, axis=-1: iqm(np.concatenate(samples, axis=axis), axis=axis)
    return _with_interval(point, n, f"IQM, stratified bootstrap over {len(tasks)} task(s)", tuple(tasks), stat,
                          level, reps)


def _with_interval(point: float, n: int, basis: str, samples: tuple, stat, level: float, reps: int) -> Estimate:
    """The point estimate with its stratified percentile-bootstrap interval (none when the
    resamples are degenerate: every resample gives the same value)."""
    from scipy import stats   # (see iqm)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        ci = stats.bootstrap(samples, stat, n_resamples=reps, confidence_level=level, method="percentile",
                             vectorized=True, random_state=np.random.default_rng(SEED)).confidence_interval
    if not (math.isfinite(ci.low) and math.isfinite(ci.high)):
        return Estimate(point, None, None, n, basis + ": no interval (every resample gives the same value)")
    return Estimate(point, float(ci.low), float(ci.high), n, basis)


def _improvement(x: np.ndarray, y: np.ndarray, axis=-1):
    """U / (n m) along `axis` (mannwhitneyu broadcasts over the other axes: one call per resample set)."""
    from scipy import stats   # (see iqm)

    return stats.mannwhitneyu(x, y, axis=axis).statistic / (x.shape[axis] * y.shape[axis])


def probability_of_improvement(x: dict, y: dict, level: float = 0.95, reps: int = REPS,
                               higher_is_better: bool = True) -> Estimate:
    """P(X > Y) (or P(X < Y) when lower is better) averaged over the tasks both have, with a
    stratified bootstrap interval (each side resampled within each task)."""
    keys = [k for k in x if k in y and len(x[k]) and len(y[k])]
    if not keys:
        return Estimate()
    sign = 1.0 if higher_is_better else -1.0
    xs = [sign * np.asarray(x[k], float) for k in keys]
    ys = [sign * np.asarray(y[k], float) for k in keys]
    point = float(np.mean([_improvement(a, b) for a, b in zip(xs, ys)]))
    n = min(sum(map(len, xs)), sum(map(len, ys)))
    if any(len(a) < 2 for a in xs + ys):
        return Estimate(point, None, None, n, "probability of improvement, too few runs for a bootstrap")

    def stat(*samples, axis=-1):
        half = len(samples) // 2
        return np.mean([_improvement(a, b, axis) for a, b in zip(samples[:half], samples[half:])], axis=0)

    return _with_interval(point, n, f"Mann–Whitney over {len(keys)} task(s), stratified bootstrap",
                          tuple(xs + ys), stat, level, reps)
