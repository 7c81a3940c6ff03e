"""The blocked model of a star family (stats/blocked.py): its variance estimates against the library
and against simulation, the contrasts it tests and those it leaves paired, each of its corners (a
clipped estimate, the hub's test and df, an inert twin, a shared seed shock), and its error rate and
power on simulated sweeps whose truth is known through the report's real path
(benchmarks/report_blocked_sim.py's `run`: a sample in the fast tier, the full count in the slow one)."""
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import special

from grpo_ablate.report.build import build_report
from grpo_ablate.stats.blocked import (blocked_delta, fit_star, hub_noisier_p, prior_degrees_of_freedom,
                                       residual_correlation, shared_shock_p, shukla_df, shukla_variances, stars,
                                       trigamma_inverse)
from report_sim import star_names, star_table, table_verdicts, write_sweep, write_table_sweep

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import report_blocked_sim as bench  # noqa: E402

DECIDED = ("helps", "hurts")
NAMES = ["all"] + [f"drop-t{i}" for i in range(6)]


def table(values: np.ndarray) -> dict:
    """variant -> {seed: value} of a variants × seeds array (row 0 the hub `all`)."""
    return {name: dict(enumerate(map(float, row))) for name, row in zip(NAMES, values)}


# --------------------------------------------------------------------------- the estimates
def test_pooled_variance_is_the_additive_models_residual_mean_square():
    sm = pytest.importorskip("statsmodels.formula.api")
    import pandas as pd

    rng = np.random.default_rng(0)
    y = rng.normal(0.8, 0.03, (7, 5)) + rng.normal(0, 0.05, 5)[None, :]
    frame = pd.DataFrame([{"y": y[v, s], "v": v, "s": s} for v in range(7) for s in range(5)])
    fit = sm.ols("y ~ C(v) + C(s)", frame).fit()
    own, pooled, df = shukla_variances(y)
    assert df == fit.df_resid == 24
    assert pooled == pytest.approx(fit.mse_resid, rel=1e-12)
    # Shukla's variances average to the pooled one (before clipping at 0, none clipped here)
    assert (own > 0).all() and own.mean() == pytest.approx(pooled, rel=1e-12)


def test_shukla_variances_are_unbiased_when_the_variants_variances_differ():
    rng = np.random.default_rng(1)
    sd = np.array([0.03, 0.02, 0.04, 0.03, 0.05, 0.025, 0.035])
    draws = np.array([shukla_variances(rng.normal(0, 1, (7, 5)) * sd[:, None] + rng.normal(0, 0.1, 5))[0]
                      for _ in range(4000)])
    assert (draws <= 0).any()                   # unclipped: an estimate can come out <= 0 (the fit reads it unknown)
    assert draws.mean(axis=0) == pytest.approx(sd ** 2, rel=0.08)


@pytest.mark.parametrize("v, s", [(7, 5), (4, 3), (13, 10)])
def test_shukla_df_is_the_estimators_effective_df(v, s):
    """Under equal variances Var(σ̂²) = 2σ⁴ / d: the closed form's d against 20,000 simulated tables
    (2.93 at 7 × 5, not S − 1 = 4: the estimates spread more than a χ² with S − 1 df)."""
    rng = np.random.default_rng(v * s)
    y = rng.standard_normal((20000, v, s))
    resid = y - y.mean(axis=2, keepdims=True) - y.mean(axis=1, keepdims=True) + y.mean(axis=(1, 2), keepdims=True)
    rows = (resid ** 2).sum(axis=2)
    own = v / ((v - 2) * (s - 1)) * (rows - rows.sum(axis=1, keepdims=True) / (v * (v - 1)))
    assert own.mean() == pytest.approx(1.0, abs=0.02)
    assert 2 / own.var() == pytest.approx(shukla_df(v, s), rel=0.05)
    assert shukla_df(7, 5) == pytest.approx(2.927, abs=1e-3)


def test_trigamma_inverse_and_the_prior_df():
    for x in (1e-3, 0.1, 0.64, 3.0, 50.0):
        assert float(special.polygamma(1, trigamma_inverse(x))) == pytest.approx(x, rel=1e-6)
    assert prior_degrees_of_freedom(np.full(7, 0.001), 4.0) == math.inf          # no spread: alike
    spread = np.geomspace(1 / 9, 9, 7) * 0.001                                   # SDs 0.33-3x
    assert 0 < prior_degrees_of_freedom(spread, 4.0) < 3
    # a clipped estimate (NaN, or <= 0) is unknown: left out of the fit, not floored into a huge spread
    assert prior_degrees_of_freedom(np.array([np.nan, *spread[1:]]), 4.0) == prior_degrees_of_freedom(spread[1:], 4.0)
    assert prior_degrees_of_freedom(np.array([0.0, np.nan, 0.001]), 4.0) == math.inf   # one known: nothing differs


def test_stars_are_a_shared_arm_and_its_leaves():
    loo = [("all", f"drop-{t}") for t in "abc"]
    assert stars(loo) == {"all": ["drop-a", "drop-b", "drop-c"]}
    assert stars([("base+a", "base"), ("base+b", "base")]) == {"base": ["base+a", "base+b"]}
    ladder = [("b", "a"), ("c", "b"), ("d", "c")]                                 # inner steps: no star
    assert stars(ladder) == {}
    pairwise = [("a", "b"), ("a", "c"), ("b", "c")]
    assert stars(pairwise) == {}


def test_a_contrast_is_the_paired_mean_with_the_models_variances():
    rng = np.random.default_rng(2)
    y = rng.normal(0.8, 0.03, (7, 5)) + rng.normal(0, 0.05, 5)[None, :]
    values = table(y)
    fit = fit_star(values, "all", NAMES[1:])
    est = blocked_delta(fit, "all", "drop-t2", values)
    assert est.mean == pytest.approx(float((y[0] - y[3]).mean()), abs=1e-12)
    var = fit.var["all"] / 5 + fit.var["drop-t2"] / 5
    assert est.se == pytest.approx(math.sqrt(var), rel=1e-12)
    if fit.alike and not fit.hub_own:
        assert est.df == 24 and fit.var["drop-t2"] == pytest.approx(fit.pooled) == fit.var["all"]
    assert est.p == pytest.approx(2 * float(special.stdtr(est.df, -abs(est.mean) / est.se)), rel=1e-12)


def test_a_leaf_missing_a_block_is_tested_paired_and_the_report_says_so(tmp_path):
    rng = np.random.default_rng(3)
    path, _ = write_sweep(tmp_path / "s", rng, broken={("drop-t0", 1), ("drop-t0", 3)})
    report = build_report(path, summary="last_3")
    by = {v["trick"]: v for v in report.verdicts}
    assert by["t0"]["delta"].basis.startswith("paired over seeds 0, 2, 4")
    assert all(by[t]["delta"].basis.startswith("blocked over seeds 0, 1, 2, 3, 4") for t in ("t1", "t5"))
    row = next(r for r in report.rows if r["variant"] == "drop-t1")    # the variants table: the same model
    assert row["delta"].mean == pytest.approx(-by["t1"]["delta"].mean) and row["delta"].se == by["t1"]["delta"].se
    model = by["t1"]["family"]["model"]
    assert "6 variants × 5 seeds" in model and "1 contrast paired" in model
    assert report.sensitivity["test"] == "paired" and set(report.sensitivity["verdicts"]) == set(by)


def test_the_paired_test_is_still_there(tmp_path):
    rng = np.random.default_rng(0)
    y = star_table(rng, tricks=3, effects={0: 0.04})
    path = write_table_sweep(tmp_path / "s", y)
    paired = build_report(path, test="paired")
    assert all(v["delta"].basis.startswith("paired") for v in paired.verdicts) and paired.sensitivity is None
    assert paired.verdicts[0]["family"]["model"] == "paired t per contrast"
    blocked = build_report(path)
    assert all(v["delta"].basis.startswith("blocked") for v in blocked.verdicts)
    assert [v["delta"].mean for v in blocked.verdicts] == pytest.approx([v["delta"].mean for v in paired.verdicts])




# --------------------------------------------------------------------------- the corners
def values_of(y: np.ndarray) -> dict:
    return {name: dict(enumerate(map(float, row))) for name, row in zip(star_names(len(y) - 1), y)}


def first_table(seed: int, accept, **options) -> np.ndarray:
    """The first simulated table (star_table) that `accept` takes, from a fixed generator."""
    rng = np.random.default_rng(seed)
    while True:
        y = star_table(rng, **options)
        if accept(y):
            return y


def test_the_hub_test_is_an_f_test_on_the_hub_against_its_leaves():
    sm = pytest.importorskip("statsmodels.formula.api")
    import pandas as pd
    from scipy import stats

    rng = np.random.default_rng(7)
    y = star_table(rng)
    leaves = pd.DataFrame([{"y": y[v, s], "v": v, "s": s} for v in range(1, 7) for s in range(5)])
    ms = sm.ols("y ~ C(v) + C(s)", leaves).fit().mse_resid                      # the leaves' pooled variance
    f = np.var(y[0] - y[1:].mean(axis=0), ddof=1) / ((1 + 1 / 6) * ms)
    assert hub_noisier_p(y) == pytest.approx(float(stats.f.sf(f, 4, 20)), rel=1e-9)
    # its null p-values are uniform (F(4, 20) exactly under equal normal variances), and a 3x hub is found
    nulls = [hub_noisier_p(rng.standard_normal((7, 5))) for _ in range(3000)]
    assert stats.kstest(nulls, "uniform").pvalue > 0.01
    noisy = [hub_noisier_p(rng.standard_normal((7, 5)) * np.array([3.0] + [1.0] * 6)[:, None]) for _ in range(500)]
    assert np.mean(np.array(noisy) < 0.15) > 0.8


def test_the_shock_check_is_scipys_monte_carlo_test():
    from scipy import stats

    rng = np.random.default_rng(8)
    for shock in (0.0, 3.0):
        y = star_table(rng, shock=shock)
        sd = np.sqrt(np.linspace(1, 2, 7)) * 0.015
        draws = np.random.default_rng(20260601)
        theirs = stats.monte_carlo_test(
            (y.ravel(),), lambda size: draws.standard_normal(size) * np.repeat(sd, 5), n_resamples=400,
            statistic=lambda x, axis: residual_correlation(x.reshape(-1, 7, 5)).squeeze(), vectorized=True,
            alternative="greater", axis=-1)
        assert shared_shock_p(y, sd ** 2) == pytest.approx(theirs.pvalue, abs=1e-15)


def test_a_leaf_equal_to_the_hub_leaves_the_fit_and_gets_the_paired_verdict():
    """An inert twin (the hub's numbers at every seed): no interval, no test and no place in Holm's m;
    the other contrasts are the model's over the remaining arms."""
    y = star_table(np.random.default_rng(9), twin=True)
    fit = fit_star(values_of(y), "all", star_names(6)[1:], 1 / 500)
    assert fit.left_out == ("drop-t5",) and "drop-t5" not in fit.var and len(fit.leaves) == 5
    verdicts = table_verdicts(y)
    twin = verdicts["t5"]
    assert twin["verdict"] == "no verdict" and "every seed gave the same Δ" in twin["why"]
    assert twin["delta"].p is None and twin["delta"].basis.startswith("paired") and twin["delta"].zero_spread
    assert twin["family"]["tests"] == 5 and "`drop-t5` left out" in twin["family"]["model"]
    assert all(verdicts[f"t{i}"]["delta"].basis.startswith("blocked") for i in range(5) if fit.paired is None)
    # a shifted copy too: the same Δ at every seed is no spread to test against, on the model's side as well
    y[-1] = y[0] - 0.01
    assert table_verdicts(y)["t5"]["verdict"] == "no verdict"


def test_a_hub_whose_own_estimate_clips_decides_nothing_a_paired_t_would_not():
    y = first_table(10, lambda y: shukla_variances(y)[0][0] <= 0)
    fit = fit_star(values_of(y), "all", star_names(6)[1:], 1 / 500)
    assert fit.own["all"] is None and "came out ≤ 0" in fit.paired
    blocked, paired = table_verdicts(y), table_verdicts(y, test="paired")
    assert all(v["delta"].basis.startswith("paired") for v in blocked.values())
    assert {t: v["verdict"] for t, v in blocked.items()} == {t: v["verdict"] for t, v in paired.items()}


def test_a_clipped_leaf_is_unknown_and_does_not_switch_borrowing_off():
    """A leaf whose estimate clips gets the prior (the pooled variance with the prior's df), and the
    prior's fit leaves it out: equal variances still borrow (the old floor at 1e-5 of the mean drove d0
    to ~0.5 in any report with a clipped arm)."""
    y = first_table(11, lambda y: (shukla_variances(y)[0][1:] <= 0).any() and shukla_variances(y)[0][0] > 0
                    and fit_star(values_of(y), "all", star_names(6)[1:], 1 / 500).alike)
    fit = fit_star(values_of(y), "all", star_names(6)[1:], 1 / 500)
    clipped = [v for v in fit.leaves if fit.own[v] is None]
    assert clipped and all(fit.var[v] == fit.pooled and fit.df[v] == fit.pooled_df for v in clipped)
    assert "unknown" in fit.describe()
    raw = shukla_variances(y)[0]
    assert fit.prior_df == prior_degrees_of_freedom(np.where(raw > 0, raw, np.nan), shukla_df(7, 5)) == math.inf


def test_the_hubs_df_follow_the_variance_it_uses():
    rng = np.random.default_rng(12)
    hub = [3.0] + [1.0] * 6
    y = first_table(12, lambda y: fit_star(values_of(y), "all", star_names(6)[1:], 1 / 500).hub_own, scale=hub)
    fit = fit_star(values_of(y), "all", star_names(6)[1:], 1 / 500)
    assert fit.var["all"] == fit.own["all"] and fit.df["all"] == 4 and fit.hub_p < 0.15
    assert "noisier than its leaves" in fit.describe()
    quiet = first_table(13, lambda y: not fit_star(values_of(y), "all", star_names(6)[1:], 1 / 500).hub_own)
    fit = fit_star(values_of(quiet), "all", star_names(6)[1:], 1 / 500)
    assert fit.df["all"] == fit.df["drop-t0"] and fit.var["all"] != fit.own["all"]
    del rng
    # at four seeds or fewer the F test has too few df: the hub keeps its own variance whenever it is larger
    three = first_table(16, lambda y: (lambda f: f.paired is None and f.own["all"] and f.own["all"] > f.pooled
                                       and f.hub_p >= 0.15)(fit_star(values_of(y), "all", star_names(6)[1:], 1 / 500)),
                        seeds=3)
    fit = fit_star(values_of(three), "all", star_names(6)[1:], 1 / 500)
    assert fit.hub_own and not fit.hub_tested and fit.var["all"] == fit.own["all"] and fit.df["all"] == 2
    assert "with 3 seeds the F test cannot let it borrow" in fit.describe()


def test_a_shared_seed_shock_sends_the_star_to_the_paired_test():
    y = first_table(14, lambda y: True, shock=6.0)
    fit = fit_star(values_of(y), "all", star_names(6)[1:], 1 / 500)
    assert fit.shock_p < 0.05 and "shared seed shock" in fit.paired
    assert all(v["delta"].basis.startswith("paired") for v in table_verdicts(y).values())


def test_the_oracles_tail_is_scipys_multivariate_normal():
    from scipy import stats

    lam = np.array([0.7, 0.6, 0.5, 0.3])
    cov = np.outer(lam, lam) + np.diag(1 - lam ** 2)
    inside = stats.multivariate_normal(np.zeros(4), cov).cdf(np.full(4, 2.5), lower_limit=np.full(4, -2.5))
    assert bench.max_abs_tail(2.5, lam) == pytest.approx(1 - inside, abs=2e-4)


# --------------------------------------------------------------------------- error rate and power
def test_the_report_decides_as_its_functions_do_on_the_simulated_sweeps(tmp_path):
    """The simulation's fast path (the report's functions on the table) and `build_report` on the sweep
    dir written from it give the same verdicts and adjusted p-values, in every kind of corner."""
    rng = np.random.default_rng(15)
    for i, (name, options, failed) in enumerate([("twin", {"twin": True}, set()), ("failed", {}, {(1, 2)}),
                                                 ("shock", {"shock": 3.0}, set()),
                                                 ("effect", {"effects": {0: 0.05}}, set())]):
        y = star_table(rng, **options)
        report = build_report(write_table_sweep(tmp_path / name, y, broken=failed))
        fast = table_verdicts(y, missing=failed)
        assert [(v["verdict"], v["delta"].p_adjusted) for v in report.verdicts] == \
            [(fast[v["trick"]]["verdict"] if v["verdict"] != "breaks training" else v["verdict"],
              fast[v["trick"]]["delta"].p_adjusted) for v in report.verdicts], name
        assert report.verdicts[0]["family"]["model"] == fast["t0"]["family"]["model"]


POWER_BEFORE = 0.484     # the model before issue 60 on the same 1,000 sweeps (docs/statistics.md)


def limit(n: int, rate: float = 0.05) -> float:
    return rate + 2 * math.sqrt(rate * (1 - rate) / n)


def test_every_scenario_holds_its_error_rate_on_a_sample():
    """A sample of each scenario of benchmarks/report_blocked_sim.py through the report's functions, 30
    reports each: together they name a false effect in at most 5% + 2 MC SE of the 420, and none in a
    quarter of its own (a broken corner: the clipped hub named one in 18%); the slow tier measures each."""
    false = 0
    for name in bench.SCENARIOS:
        out = bench.run(name, 30, "functions", power=False)
        false += round(out["false_report"]["blocked"]["rate"] * 30)
        assert out["false_report"]["blocked"]["rate"] < 0.25, (name, out)
        if name == "inert twin of the hub":
            assert out["twin_contrast_tested"] == 0
    assert false / (30 * len(bench.SCENARIOS)) <= limit(30 * len(bench.SCENARIOS))


@pytest.mark.full
@pytest.mark.parametrize("name", ["null, 5 seeds", "hub 3x noisier", "shared seed shock 3 sigma",
                                  "inert twin of the hub"])
def test_the_error_rate_holds_through_the_functions(name):
    out = bench.run(name, 400, "functions")
    assert out["false_report"]["blocked"]["rate"] <= limit(400), out


ACCEPTANCE = [name for name in bench.SCENARIOS if not name.startswith(("hub 1.5x", "hub 2x"))]
BEFORE = {"hub 1.5x noisier": 0.0553, "hub 2x noisier": 0.045}    # the model before issue 60, 3,000 tables


@pytest.mark.slow
@pytest.mark.parametrize("name", ACCEPTANCE)
def test_the_error_rate_holds_through_the_report(name):
    """The benchmark's scenarios through build_report, 1,000 reports each: at most 5% + 2 MC SE."""
    out = bench.run(name, 1000, "report")
    assert out["false_report"]["blocked"]["rate"] <= limit(1000), out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BEFORE))
def test_a_moderately_noisier_hub_is_no_worse_than_before(name):
    """A hub 1.5-2x noisier is found noisier only about half the time on 4 df: the residual of issue 60
    (docs/statistics.md). It must not be worse than the model before it (+ 2 MC SE)."""
    out = bench.run(name, 1000, "report")
    assert out["false_report"]["blocked"]["rate"] <= BEFORE[name] + 2 * math.sqrt(0.05 * 0.95 / 1000), out


@pytest.mark.slow
def test_the_power_at_the_aa_noise_floor_through_the_report():
    """+0.03, five seeds, one effect among six: at least the model before issue 60 on the same 1,000
    sweeps (48.4%; docs/statistics.md), and more than twice the paired t's."""
    out = bench.run("power +0.03", 1000, "report")
    assert out["power"]["blocked"]["rate"] >= POWER_BEFORE - 2 * out["power"]["blocked"]["mc_se"], out
    assert out["power"]["blocked"]["rate"] > 2 * out["power"]["paired"]["rate"]


@pytest.mark.slow
def test_the_power_sections_detectable_delta_is_detected_through_the_report():
    out = bench.detectable(400, "report")
    assert out["detected"]["rate"] >= 0.8 - 2 * math.sqrt(0.8 * 0.2 / out["detected"]["n"]), out


@pytest.mark.full
def test_the_power_sections_detectable_delta_is_detected():
    """Issue 60's acceptance: a sweep whose true effect is the detectable |Δ| a null report printed is
    detected by the report's own test at least 80% of the time (- 2 MC SE)."""
    out = bench.detectable(300, "functions")
    assert out["detected"]["rate"] >= 0.8 - 2 * math.sqrt(0.8 * 0.2 / out["detected"]["n"]), out


@pytest.mark.full
def test_the_model_is_more_powerful_than_the_paired_t():
    out = bench.run("power +0.05", 200, "functions")
    assert out["power"]["blocked"]["rate"] > 1.2 * out["power"]["paired"]["rate"], out
    assert out["power"]["oracle"]["rate"] >= out["power"]["blocked"]["rate"] - 0.05
