"""The report's statistics: t quantiles from tables, paired and Welch intervals by hand.
"""
import math

import numpy as np
import pytest

from grpo_ablate.report.build import build_report
from grpo_ablate.stats.intervals import delta_ci
from grpo_ablate.stats.student import t_quantile
from report_fixtures import make_sweep


def test_t_quantile_matches_tables():
    for df, t in [(1, 12.706205), (2, 4.302653), (3, 3.182446), (4, 2.776445), (30, 2.042272)]:
        assert t_quantile(0.975, df) == pytest.approx(t, abs=1e-6)
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)
    assert 2.776445 < t_quantile(0.975, 3.5) < 3.182446   # fractional df (Welch) in between



def test_one_missing_run_pairs_on_the_shared_seeds(tmp_path):
    # a missing (or NaN) run used to switch the whole contrast to Welch over unpaired seeds;
    # the interval is now the paired one on the seeds both sides have, and the dropped seed is said
    variants = {"base": {"tricks": [], "reference": None, "final": {0: 0.60, 1: 0.64, 2: 0.62}},
                "+x": {"tricks": ["x"], "reference": "base", "final": {0: 0.75, 1: 0.80}}}
    report = build_report(make_sweep(tmp_path / "s", variants, mode="add-one-in",
                                     contrasts=[{"trick": "x", "with": "+x", "without": "base"}]))
    d = report.verdicts[0]["delta"]
    diffs = np.array([0.75 - 0.60, 0.80 - 0.64])
    half = t_quantile(0.975, 1) * diffs.std(ddof=1) / math.sqrt(2)
    assert (d.mean, d.low, d.high) == pytest.approx((diffs.mean(), diffs.mean() - half, diffs.mean() + half),
                                                    abs=1e-9)
    assert d.n == 2 and "paired over seeds 0, 1" in d.basis and "seed 2 no number on the treated side" in d.basis
    assert d.dropped == {2: "no number on the treated side"}


def test_welch_only_when_the_sides_share_no_seed():
    d = delta_ci({0: 0.75, 1: 0.80}, {2: 0.60, 3: 0.64, 4: 0.62})
    a, b = np.array([0.75, 0.80]), np.array([0.60, 0.64, 0.62])
    va, vb = a.var(ddof=1) / 2, b.var(ddof=1) / 3
    df = (va + vb) ** 2 / (va ** 2 / 1 + vb ** 2 / 2)
    half = t_quantile(0.975, df) * math.sqrt(va + vb)
    assert "Welch" in d.basis
    assert (d.mean, d.low, d.high) == pytest.approx((0.155, 0.155 - half, 0.155 + half), abs=1e-9)



def test_fisher_exact_p_is_scipys_on_every_small_table():
    """stats/exact.fisher_exact_p (written out: scipy.stats is slow to import) against scipy's own."""
    import itertools

    from scipy.stats import fisher_exact

    from grpo_ablate.stats.exact import fisher_exact_p

    for n1, n2 in ((1, 1), (3, 5), (5, 5), (12, 12), (12, 7)):
        for a, c in itertools.product(range(n1 + 1), range(n2 + 1)):
            table = [[a, n1 - a], [c, n2 - c]]
            assert fisher_exact_p(table) == pytest.approx(fisher_exact(table).pvalue, rel=1e-12, abs=1e-15), table
