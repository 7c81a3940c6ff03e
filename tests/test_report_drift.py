"""Curves that do not lie: the drift test before a fit is read as a ceiling,
exclusion counted and tested per arm, and forecasts scored on what the measurement decided.

The simulations draw eval accuracies as the trainer's evals are: k correct of `task.eval_size`
problems, binomial around a known mean curve, and go through the report's own functions
(drift.drift, scaling.fit_section) on in-memory sweeps. Each states what it measured when it was
written and its Monte-Carlo error; the draws are seeded, so a run of the test is reproducible.
"""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from grpo_ablate.design import Contrast, Variant
from grpo_ablate.report import scaling
from grpo_ablate.report.curves import Curve, Summary
from grpo_ablate.report.drift import DRIFT_ALPHA, arm_drift, drift, late_window
from grpo_ablate.report.fits import sigmoid
from grpo_ablate.report.load import Run, Sweep
from grpo_ablate.report.scaling import (BOTH_DRIFT, DRIFTS_LESS, DRIFTS_MORE, LOWERS, RAISES, SELECTED,
                                        drift_verdict, exclusion_test, extrapolation_variance, summary_weights,
                                        widen)
from grpo_ablate.stats.intervals import Estimate

TOKENS = 1000                    # compute per step
EVAL_SIZE = 200                  # the embedded task's eval: one eval's SE is 0.025 at 0.85
DEFAULT = (30, 5)                # the default run: 30 steps, an eval every 5 (7 points with the base)
LONG = (40, 2)


def eval_steps(shape=DEFAULT) -> np.ndarray:
    last, every = shape
    return np.arange(0, last + 1, every, dtype=float)


def rise(steps: np.ndarray, A: float, R0: float = 0.55) -> np.ndarray:
    """A fast monotone rise from R0 to A: 97% of the gain by step 10 (the default's peak step)."""
    return np.where(steps > 0, sigmoid(steps * TOKENS, R0, A, 4.0, 4 * TOKENS), R0)


def late_drift(steps: np.ndarray, size: float, start: float) -> np.ndarray:
    """A linear decline from `start` to the last step, reaching −size there."""
    return -size * np.clip((steps - start) / (steps[-1] - start), 0.0, 1.0)


def binomial(rng, mu: np.ndarray, n: int = EVAL_SIZE, draws: int | None = None) -> np.ndarray:
    mu = np.clip(mu, 0.0, 1.0)
    return rng.binomial(n, mu, size=None if draws is None else (draws, len(mu))) / n


def flag_rate(rng, mu: np.ndarray, draws: int, shape=DEFAULT) -> float:
    steps = eval_steps(shape)
    return float(np.mean([drift(Curve(steps, steps * TOKENS, v), EVAL_SIZE).drifting
                          for v in binomial(rng, mu, draws=draws)]))


def mc_error(rate: float, draws: int) -> float:
    return float(np.sqrt(max(rate * (1 - rate), DRIFT_ALPHA * (1 - DRIFT_ALPHA)) / draws))


# --------------------------------------------------------------------------- one run's drift test
def test_the_late_window_is_the_last_third_and_at_least_two():
    assert [late_window(m) for m in (3, 6, 7, 20)] == [2, 2, 3, 7]
    steps = eval_steps()
    d = drift(Curve(steps, steps, np.array([0.685, 0.9, 0.95, 0.9, 0.85, 0.8, 0.775])), EVAL_SIZE)
    # the default's own curve on a fresh clone, constant lr: 0.950 at step 10, 0.775 at step 30
    assert d.peak == 0.95 and d.peak_step == 10 and d.late == pytest.approx(0.7875) and d.window == 2
    assert d.se == pytest.approx(np.sqrt(0.7875 * 0.2125 / EVAL_SIZE))       # the larger of the two SEs
    assert d.drifting and d.p < 0.001 and "peaks at 0.950 (step 10)" in d.describe()
    assert drift(Curve(steps[:3], steps[:3], np.array([0.5, 0.6, 0.7])), EVAL_SIZE) is None   # too few evals


@pytest.mark.parametrize("shape", [DEFAULT, LONG])
def test_a_monotone_curve_is_flagged_at_most_5_percent(shape):
    """The plateau is the least favourable monotone curve (every earlier mean equals the late
    ones), and p = 0.5 its worst level (the binomial SE is largest, its estimate never above the
    truth). Measured when written, 4,000 curves each: plateau 0.5 flagged 0.0475 (default shape)
    and 0.053 (40 steps, every 2), MC error ±0.0035 (at 40,000: 0.0485 and 0.0513, ±0.0011); the
    saturating rise 0.018 and 0.016."""
    rng = np.random.default_rng(31)
    steps = eval_steps(shape)
    draws = 4000
    plateau = flag_rate(rng, np.where(steps > 0, 0.5, 0.3), draws, shape)
    assert plateau <= DRIFT_ALPHA + 2.5 * mc_error(plateau, draws), plateau
    saturating = flag_rate(rng, rise(steps, 0.89), draws, shape)
    assert saturating <= DRIFT_ALPHA, saturating


def test_an_arm_of_monotone_runs_is_unstable_at_most_5_percent():
    """Five runs summed against five independent plateau nulls: measured 0.052 (p = 0.5 plateau,
    1,000 arms, MC error ±0.007) when written."""
    rng = np.random.default_rng(32)
    steps = eval_steps()
    curves = binomial(rng, np.where(steps > 0, 0.5, 0.3), draws=5000)
    tests = [drift(Curve(steps, steps * TOKENS, v), EVAL_SIZE) for v in curves]
    rate = float(np.mean([arm_drift(tests[i:i + 5]) < DRIFT_ALPHA for i in range(0, len(tests), 5)]))
    assert rate <= DRIFT_ALPHA + 2.5 * mc_error(rate, 1000), rate
    assert arm_drift([]) is None and arm_drift([None]) is None


def test_a_late_drift_is_found_in_an_arm_more_often_than_in_a_run():
    """A drift of −0.08 from the peak (step 10) to the end, eval_size 200: one run is flagged
    in under half of the draws, an arm of five in nearly all (measured 0.45 of 2,500 runs and 0.97
    of 500 arms when written) — which is why the contrast reads the arm's test."""
    rng = np.random.default_rng(33)
    steps = eval_steps()
    curves = binomial(rng, rise(steps, 0.89) + late_drift(steps, 0.08, 10), draws=2500)
    tests = [drift(Curve(steps, steps * TOKENS, v), EVAL_SIZE) for v in curves]
    per_run = np.mean([t.drifting for t in tests])
    per_arm = np.mean([arm_drift(tests[i:i + 5]) < DRIFT_ALPHA for i in range(0, len(tests), 5)])
    assert 0.2 < per_run < 0.6 and per_arm > 0.8, (per_run, per_arm)


# --------------------------------------------------------------------------- the contrast's gates
def test_exclusion_is_tested_with_fishers_exact_test():
    counts = lambda used, poor=0, drifting=0: {"used": used, "poor fit": poor, "drifting": drifting}
    assert exclusion_test(counts(1, poor=2, drifting=2), counts(5)) == pytest.approx(0.047619, abs=1e-6)  # 4/5 vs 0/5
    assert exclusion_test(counts(2, drifting=3), counts(5)) == pytest.approx(0.166667, abs=1e-6)           # 3/5 vs 0/5
    assert exclusion_test(counts(5), counts(5)) is None           # nothing excluded: nothing to test
    assert exclusion_test(counts(3, poor=2), counts(3, poor=2)) == 1.0


def test_which_arm_drifts():
    assert drift_verdict(0.01, 0.5) == DRIFTS_MORE and drift_verdict(0.5, 0.01) == DRIFTS_LESS
    assert drift_verdict(0.01, 0.02) == BOTH_DRIFT and drift_verdict(0.2, None) is None


# --------------------------------------------------------------------------- through fit_section
def sim_sweep(values_of: dict, steps: np.ndarray) -> tuple[Sweep, dict]:
    """An in-memory two-arm sweep (variant -> one eval curve per seed), as load_sweep builds it."""
    runs, curves = [], {}
    for name, per_seed in values_of.items():
        for seed, v in enumerate(per_seed):
            runs.append(Run(name, seed, Path(f"sim/{name}-s{seed}"), "completed",
                            metrics=pd.DataFrame({"step": steps, "eval/accuracy": v}),
                            config={"task": {"eval_size": EVAL_SIZE}}))
            curves.setdefault(name, {})[seed] = Curve(steps, steps * TOKENS, v)
    sweep = Sweep(Path("sim"), "sim", variants=[Variant("all"), Variant("drop-t")], runs=runs,
                  contrasts=[Contrast("t", "all", "drop-t")])
    return sweep, curves


def simulate(mu_with: np.ndarray, mu_without: np.ndarray, draws: int, seed: int, seeds: int = 5) -> list[dict]:
    """fit_section's contrast on `draws` sweeps: binomial evals around the two mean curves, and a
    seed effect on the level (sd 0.01) shared by both arms of a seed, as a paired design has."""
    rng = np.random.default_rng(seed)
    steps = eval_steps()
    out = []
    for _ in range(draws):
        shift = rng.normal(0, 0.01, seeds)[:, None] * (steps > 0)[None, :]
        values = {"all": [binomial(rng, mu_with + shift[s]) for s in range(seeds)],
                  "drop-t": [binomial(rng, mu_without + shift[s]) for s in range(seeds)]}
        sweep, curves = sim_sweep(values, steps)
        out.append(scaling.fit_section(sweep, "eval/accuracy", True, curves)["contrasts"][0])
    return out


def late_drift_rate(draws: int) -> tuple[float, list[dict]]:
    steps = eval_steps()
    shared_peak = rise(steps, 0.89)
    contrasts = simulate(shared_peak + late_drift(steps, 0.08, 10), shared_peak, draws, seed=2026)
    return float(np.mean([c["ceiling"] == LOWERS for c in contrasts])), contrasts


@pytest.mark.full
def test_a_late_drift_is_not_a_lower_ceiling():
    """Both arms share the peak (0.89 by step 10); the runs with the trick drift late, −0.08 by
    step 30, five seeds, eval_size 200. Before the drift test the report called this *lowers the
    ceiling* in 0.970 ± 0.012 of 200 draws (the same draws with the drift and exclusion gates
    switched off). Measured when written through fit_section: 1 of these 40 draws called *lowers
    the ceiling* (0.025 ± 0.025), 0.975 *drifts more*; the slow test's 400 draws: 0.0075 ± 0.0043.
    The bound asserted is 5%."""
    rate, contrasts = late_drift_rate(40)
    assert rate <= 0.05, rate
    said = [c["split"] for c in contrasts]
    assert np.mean([DRIFTS_MORE in s for s in said]) > 0.8          # and it says what it is
    withheld = next(c for c in contrasts if c["drift"] == DRIFTS_MORE)
    assert withheld["ceiling"] is None and "the runs with the trick drift" in withheld["withheld"]


@pytest.mark.slow
def test_a_late_drift_is_not_a_lower_ceiling_400_draws():
    """The same at 400 draws: measured 0.0075 (MC error ±0.0043) when written; asserted ≤ 5%."""
    rate, _ = late_drift_rate(400)
    assert rate <= 0.05, rate


def ceiling_power(draws: int) -> tuple[float, list[dict]]:
    steps = eval_steps()
    contrasts = simulate(rise(steps, 0.89), rise(steps, 0.84), draws, seed=7)
    return float(np.mean([c["ceiling"] == RAISES for c in contrasts])), contrasts


@pytest.mark.full
def test_a_true_ceiling_difference_is_still_found():
    """The gate is not vacuous: monotone curves whose ceilings differ by 0.05 (0.89 vs 0.84, five
    seeds, eval_size 200) are called *raises the ceiling* in 0.660 ± 0.033 of 200 draws (0.710 ±
    0.032 with the drift and exclusion gates off, the same draws: the gates cost about their
    false-alarm rate — a run falsely flagged drops its pair). Here 30 draws: 0.70 when written."""
    power, contrasts = ceiling_power(30)
    assert power >= 0.5, power
    assert not any(c["ceiling"] == LOWERS for c in contrasts)


@pytest.mark.slow
def test_a_true_ceiling_difference_is_still_found_200_draws():
    """Measured 0.660 ± 0.033 when written."""
    power, _ = ceiling_power(200)
    assert power >= 0.6, power


def test_exclusion_that_differs_by_arm_withholds_the_ceiling():
    """Four of five runs with the trick have not bent by the last eval (midpoint beyond the data:
    a poor fit), none without: ΔA would be read on one seed chosen by the trick."""
    steps = eval_steps()
    linear = 0.55 + 0.3 * steps / steps[-1]
    plateau = rise(steps, 0.89)
    values = {"all": [linear] * 4 + [plateau], "drop-t": [plateau + 0.001 * s for s in range(5)]}
    sweep, curves = sim_sweep(values, steps)
    c = scaling.fit_section(sweep, "eval/accuracy", True, curves)["contrasts"][0]
    assert c["excluded"]["with"] == {"used": 1, "poor fit": 4, "drifting": 0}
    assert c["excluded"]["without"] == {"used": 5, "poor fit": 0, "drifting": 0}
    assert c["exclusion_p"] == pytest.approx(0.047619, abs=1e-6)
    assert c["split"] == SELECTED and c["ceiling"] is None and "selected subset" in c["withheld"]


# --------------------------------------------------------------------------- forecasts
def test_summary_weights_and_the_extrapolation_variance_by_hand():
    steps = np.array([0.0, 10, 20, 30, 40])
    whole = Curve(steps, steps, np.array([0.5, 0.6, 0.7, 0.8, 0.8]))
    assert summary_weights(whole, 3, Summary("final"), True) == pytest.approx([0, 1])
    assert summary_weights(whole, 3, Summary("last_k", 3), True) == pytest.approx([1 / 3, 1 / 3])
    assert summary_weights(whole, 3, Summary("auc"), True) == pytest.approx([10 / 40, 5 / 40])
    # final: the last eval's own noise, plus the level's error: one SE for a prefix carried flat
    # (rmse None), the fit's RMSE beyond the eval noise for a fitted one (none when it is all noise)
    se = np.sqrt(0.8 * 0.2 / EVAL_SIZE)
    assert extrapolation_variance(whole, 3, Summary("final"), True, EVAL_SIZE, None) == pytest.approx(2 * se ** 2)
    assert extrapolation_variance(whole, 3, Summary("final"), True, EVAL_SIZE, 0.05) == pytest.approx(
        se ** 2 + 0.05 ** 2 - se ** 2)
    assert extrapolation_variance(whole, 3, Summary("final"), True, EVAL_SIZE, se / 2) == pytest.approx(se ** 2)
    assert extrapolation_variance(whole, 5, Summary("final"), True, EVAL_SIZE, None) == 0.0   # nothing extrapolated


def test_widening_adds_the_extrapolation_variance_to_the_seeds():
    seeds = Estimate(0.1, 0.05, 0.15, 5, "paired over seeds 0-4")
    wider = widen(seeds, 0.0004)
    t = 2.7764451051977987        # t(0.975, 4)
    assert wider.high - wider.mean == pytest.approx(np.sqrt(0.05 ** 2 + t * t * 0.0004))
    assert widen(seeds, 0.0) is seeds and widen(Estimate(0.1, None, None, 1), 0.1).low is None


@pytest.mark.full
def test_forecast_intervals_cover_the_measured_delta_when_nothing_happens_late():
    """Monotone curves (ceilings 0.89 vs 0.84), five seeds, eval_size 200, forecast from the first
    half of 30 steps on `final`. Measured when written, 100 sweeps: the widened interval covered
    the measured Δ in 0.99, the seeds' interval alone in 0.90 (it lacks the future evals' noise).
    Here 12 sweeps."""
    from grpo_ablate.report.verdicts import decide_by_delta

    rng = np.random.default_rng(11)
    steps = eval_steps()
    covered = 0
    for _ in range(12):
        runs, measured = [], {}
        for name, mu in (("all", rise(steps, 0.89)), ("drop-t", rise(steps, 0.84))):
            for seed in range(5):
                v = binomial(rng, mu)
                runs.append(Run(name, seed, Path(f"sim/{name}-s{seed}"), "completed",
                                metrics=pd.DataFrame({"step": steps, "eval/accuracy": v}),
                                config={"steps": 30, "eval": {"every": 5}, "task": {"eval_size": EVAL_SIZE}}))
                measured.setdefault(name, []).append(v[-1])
        sweep = Sweep(Path("sim"), "sim", variants=[Variant("all"), Variant("drop-t")], runs=runs,
                      contrasts=[Contrast("t", "all", "drop-t")])
        p = scaling.predict_section(sweep, "eval/accuracy", Summary("final"), True, 0.5, decide_by_delta)
        d, truth = p["contrasts"][0]["delta"], np.mean(measured["all"]) - np.mean(measured["drop-t"])
        covered += d.low <= truth <= d.high
    assert covered >= 11, covered
