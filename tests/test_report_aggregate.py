"""The report's rliable aggregates are written out in numpy (stats/aggregate.py: scipy.stats
costs ~0.7 s to import); here each is compared with the scipy function it stands for, to the bit.
If one of these fails after a scipy upgrade, scipy changed its draw or its arithmetic: the golden
reports will say so too."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from grpo_ablate.stats.aggregate import _improvement, iqm, stratified_bootstrap_interval


def _inputs(seed: int):
    """Random score sets as a report meets them: few runs, accuracies on a 1/200 grid (ties), or continuous."""
    rng = np.random.default_rng(seed)
    for n in (2, 3, 4, 5, 7, 12):
        yield rng.integers(0, 200, n) / 200
        yield rng.normal(size=n)
        yield np.full(n, 0.5)


@pytest.mark.parametrize("seed", range(5))
def test_iqm_is_scipy_trim_mean(seed):
    for x in _inputs(seed):
        assert iqm(x) == stats.trim_mean(x, 0.25)
        table = np.stack([x, x[::-1] * 3, x + 1])
        for axis in (0, 1, -1):
            assert np.array_equal(iqm(table, axis=axis), stats.trim_mean(table, 0.25, axis=axis))


@pytest.mark.parametrize("seed", range(5))
def test_improvement_is_mannwhitneyu_statistic_over_nm(seed):
    rng = np.random.default_rng(seed)
    for x in _inputs(seed):
        y = rng.permutation(np.concatenate([x[:2], rng.integers(0, 200, 3) / 200]))   # ties across sides
        want = stats.mannwhitneyu(x, y).statistic / (len(x) * len(y))
        assert _improvement(x, y) == want
        xs, ys = rng.choice(x, (9, len(x))), rng.choice(y, (9, len(y)))   # resamples, as the bootstrap has them
        assert np.array_equal(_improvement(xs, ys, axis=-1),
                              stats.mannwhitneyu(xs, ys, axis=-1).statistic / (len(x) * len(y)))


def _scipy_interval(samples, stat, level, reps, seed):
    ci = stats.bootstrap(samples, stat, n_resamples=reps, confidence_level=level, method="percentile",
                         vectorized=True, random_state=np.random.default_rng(seed)).confidence_interval
    return float(ci.low), float(ci.high)


@pytest.mark.parametrize("seed", range(4))
def test_stratified_bootstrap_is_scipy_bootstrap_draw_for_draw(seed):
    rng = np.random.default_rng(100 + seed)
    iqm_stat = lambda *s, axis=-1: iqm(np.concatenate(s, axis=axis), axis=axis)
    for tasks in (1, 2, 3):
        samples = tuple(rng.integers(0, 200, rng.integers(2, 8)) / 200 for _ in range(tasks))
        for level, reps in ((0.95, 2000), (0.9, 501)):
            ours = stratified_bootstrap_interval(samples, iqm_stat, level, reps, np.random.default_rng(seed))
            assert ours == _scipy_interval(samples, iqm_stat, level, reps, seed)

        def improvement(*s, axis=-1):
            half = len(s) // 2
            return np.mean([_improvement(a, b, axis) for a, b in zip(s[:half], s[half:])], axis=0)

        other = tuple(x + rng.integers(-20, 20, len(x)) / 200 for x in samples)
        ours = stratified_bootstrap_interval(samples + other, improvement, 0.95, 1000, np.random.default_rng(seed))
        assert ours == _scipy_interval(samples + other, improvement, 0.95, 1000, seed)


def test_a_degenerate_bootstrap_has_no_interval_as_in_scipy():
    """Every resample the same value: both give the same (finite, zero-width) numbers or both NaN."""
    samples = (np.array([0.5, 0.5, 0.5]),)
    stat = lambda *s, axis=-1: iqm(np.concatenate(s, axis=axis), axis=axis)
    ours = stratified_bootstrap_interval(samples, stat, 0.95, 200, np.random.default_rng(0))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = _scipy_interval(samples, stat, 0.95, 200, 0)
    assert np.array_equal(ours, theirs, equal_nan=True)
