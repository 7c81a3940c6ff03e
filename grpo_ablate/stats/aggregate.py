"""Aggregate scores over runs and tasks (rliable): IQM, probability of improvement, stratified
bootstrap intervals. A "task" is what the scores are stratified by (a context; the seeds are runs).
Written in numpy rather than imported (scipy.stats costs ~0.7 s to import) and equal to scipy's
to the bit: tests/test_report_aggregate.py compares them.
Design: docs/statistics.md#aggregates-over-runs-and-contexts-rliable
"""
from __future__ import annotations

import math

import numpy as np

from grpo_ablate.stats.intervals import Estimate

REPS = 2000           # bootstrap resamples (rliable's default is 50,000; the percentile CI is stable well before)
SEED = 0              # the bootstrap's generator: a report is the same every time it is built


def iqm(scores, axis=-1):
    """The interquartile mean along `axis`: `scipy.stats.trim_mean(scores, 0.25, axis)` — cut
    int(0.25 n) values from each end (found by a partial sort) and average the rest."""
    scores = np.asarray(scores, float)
    n = scores.shape[axis]
    cut = int(0.25 * n)
    middle = [slice(None)] * scores.ndim
    middle[axis] = slice(cut, n - cut)
    return np.mean(np.partition(scores, (cut, n - cut - 1), axis=axis)[tuple(middle)], axis=axis)


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


def stratified_bootstrap_interval(samples: tuple, stat, level: float, reps: int,
                                  rng: np.random.Generator) -> tuple[float, float]:
    """The percentile interval of `stat` over `reps` resamples, each sample resampled with
    replacement within itself: `scipy.stats.bootstrap(samples, stat, n_resamples=reps,
    confidence_level=level, method="percentile", vectorized=True, random_state=rng)`, draw for
    draw (one (reps, n) index draw per sample, in order; its quantiles, `_linear_quantiles`)."""
    resamples = [s[rng.integers(0, len(s), (reps, len(s)))] for s in samples]
    alpha = (1 - level) / 2
    low, high = _linear_quantiles(stat(*resamples, axis=-1), np.array([alpha, 1 - alpha]))
    return float(low), float(high)


def _linear_quantiles(values: np.ndarray, p: np.ndarray) -> np.ndarray:
    """`scipy.stats.quantile(values, p)` (Hyndman & Fan's method 7, 'linear'), in its arithmetic:
    order statistics j = ⌊p n + 1 − p⌋ and j + 1 (1-based), weighted by the fractional part.
    (`np.quantile` interpolates the same points in another order and differs in the last bit.)"""
    y, n = np.sort(values), values.size
    if np.isnan(y[-1]):
        return np.full(p.shape, np.nan)
    position = p * n + (1 - p)
    upper = position // 1
    lower, weight = upper - 1, position % 1
    weight[lower < 0] = 0
    lower, upper = np.clip(lower, 0, n - 1).astype(int), np.clip(upper, 0, n - 1).astype(int)
    return (1 - weight) * y[lower] + weight * y[upper]


def _with_interval(point: float, n: int, basis: str, samples: tuple, stat, level: float, reps: int) -> Estimate:
    """The point estimate with its stratified percentile-bootstrap interval (none when the
    resamples are degenerate: every resample gives the same value)."""
    low, high = stratified_bootstrap_interval(samples, stat, level, reps, np.random.default_rng(SEED))
    if not (math.isfinite(low) and math.isfinite(high)):
        return Estimate(point, None, None, n, basis + ": no interval (every resample gives the same value)")
    return Estimate(point, low, high, n, basis)


def _improvement(x: np.ndarray, y: np.ndarray, axis=-1):
    """U / (n m) along `axis`, U = #(x > y) + ½ #(x = y) over all pairs: `scipy.stats.mannwhitneyu`'s
    statistic (there from the rank sum with ties at their mean rank; the same number). Broadcasts
    over the other axes: one call per resample set."""
    x, y = np.moveaxis(np.asarray(x, float), axis, -1), np.moveaxis(np.asarray(y, float), axis, -1)
    greater = (x[..., :, None] > y[..., None, :]).sum(axis=(-2, -1))
    ties = (x[..., :, None] == y[..., None, :]).sum(axis=(-2, -1))
    return (greater + 0.5 * ties) / (x.shape[-1] * y.shape[-1])


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
