"""The sequential decision rule (grpo_ablate/stats/group_sequential.py): spending, boundaries,
decisions, power, and the simulation that shows the error rate holds under repeated looks."""
import math

import numpy as np
import pytest
from scipy import stats

from grpo_ablate.stats import group_sequential as seq
from grpo_ablate.stats.group_sequential import Look, Plan

Z_9875 = 2.241402727604947          # Φ^{-1}(1 − 0.025/2): the O'Brien–Fleming-type spending at a = 0.025


# ----------------------------------------------------------------------------- spending
def test_spending_functions_follow_lan_demets():
    a = 0.025
    for t in (0.2, 0.375, 0.5, 0.9):
        assert seq.spending_function(t, a, "obrien-fleming") == pytest.approx(
            math.erfc(Z_9875 / math.sqrt(t) / math.sqrt(2)), rel=1e-12)
        assert seq.spending_function(t, a, "pocock") == pytest.approx(a * math.log(1 + (math.e - 1) * t), rel=1e-14)
    for kind in seq.SPENDING:
        assert seq.spending_function(1.0, a, kind) == pytest.approx(a, rel=1e-12)
        assert seq.spending_function(0.0, a, kind) == 0.0


def test_schedule_with_one_maximum_is_the_spending_function():
    cumulative, replanned = seq.spending_schedule([(n, 8) for n in range(3, 9)], 0.025, "obrien-fleming")
    assert not replanned
    assert cumulative == pytest.approx([seq.spending_function(n / 8, 0.025, "obrien-fleming") for n in range(3, 9)],
                                       rel=1e-12)
    assert cumulative[-1] == 0.025


def test_raising_the_maximum_midway_spreads_what_is_left():
    f = lambda t: seq.spending_function(t, 0.025, "obrien-fleming")
    cumulative, replanned = seq.spending_schedule([(3, 8), (4, 8), (5, 12), (12, 12)], 0.025, "obrien-fleming")
    expected_third = f(4 / 8) + (0.025 - f(4 / 8)) * (f(5 / 12) - f(4 / 12)) / (0.025 - f(4 / 12))
    assert not replanned
    assert cumulative[:2] == pytest.approx([f(3 / 8), f(4 / 8)], rel=1e-12)
    assert cumulative[2] == pytest.approx(expected_third, rel=1e-12)
    assert cumulative[3] == 0.025


def test_raising_the_maximum_after_all_was_spent_replans_and_says_so():
    cumulative, replanned = seq.spending_schedule([(3, 4), (4, 4), (5, 6)], 0.025, "pocock")
    assert replanned
    assert cumulative == pytest.approx([seq.spending_function(n / 6, 0.025, "pocock") for n in (3, 4, 5)], rel=1e-12)


# ----------------------------------------------------------------------------- boundaries
def test_a_single_look_is_the_fixed_t_test():
    bounds, cumulative, _ = seq.boundaries([(5, 5)], Plan(initial_seeds=5, max_seeds=5))
    assert bounds == [pytest.approx(2.7764451051977987, rel=1e-12)]      # t_{0.975, 4}
    assert cumulative == [0.025]


def test_boundaries_at_large_df_match_the_published_normal_ones():
    """At many seeds the t-statistics are nearly normal, so the exact-t boundaries, read back
    as normal quantiles, approach the Lan–DeMets O'Brien–Fleming-type boundaries for five equally
    spaced looks at two-sided 0.05 (ldbounds / gsDesign sfLDOF: 4.8769 3.3569 2.6803 2.2898 2.0310)."""
    ns = (20, 40, 60, 80, 100)
    cumulative, _ = seq.spending_schedule([(n, 100) for n in ns], 0.025, "obrien-fleming")
    bounds = seq.t_boundaries(ns, tuple(cumulative), True, sequences=1 << 18)
    as_normal = [stats.norm.isf(stats.t.sf(c, n - 1)) for c, n in zip(bounds, ns)]
    assert as_normal == pytest.approx([4.8769, 3.3569, 2.6803, 2.2898, 2.0310], abs=0.06)


def test_boundaries_are_deterministic_and_one_sided_ones_are_the_upper_half():
    looks = [(n, 8) for n in range(3, 9)]
    two, _, _ = seq.boundaries(looks, Plan())
    seq.t_boundaries.cache_clear()
    assert seq.boundaries(looks, Plan())[0] == two                  # a frozen RNG: same numbers every time
    one, _, _ = seq.boundaries(looks, Plan(), two_sided=False)
    assert one[0] == two[0] == pytest.approx(stats.t.isf(seq.spending_function(3 / 8, 0.025, "obrien-fleming"), 2))
    assert one == pytest.approx(two, rel=0.03)                       # differ only by paths that cross below
    assert all(a > b for a, b in zip(two, two[1:]))                  # O'Brien–Fleming: strict early, ~fixed late


# ----------------------------------------------------------------------------- deciding
def test_decide_stops_at_the_first_crossing_and_keeps_it():
    plan = Plan()
    bounds, _, _ = seq.boundaries([(n, 8) for n in range(3, 6)], plan)
    looks = [Look(3, 8, 1.0, 1.0), Look(4, 8, 1.0, 2.0 / bounds[1]), Look(5, 8, 0.0, 1.0)]
    d = seq.decide(looks, plan)
    # T at look 2 = 1 / ((2 / c_2) / 2) = c_2: on the boundary counts as crossing
    assert (d.outcome, d.look, d.n) == ("positive", 2, 4) and d.t == pytest.approx(bounds[1])
    assert d.rci[0] == pytest.approx(0.0, abs=1e-12) and not d.final
    hurt = seq.decide([Look(3, 8, -1.0, 1.0), Look(4, 8, -1.0, 2.0 / bounds[1])], plan)
    assert (hurt.outcome, hurt.look) == ("negative", 2)


def test_undecided_zero_spread_and_the_final_look():
    plan = Plan(max_seeds=4)
    d = seq.decide([Look(3, 4, 0.2, 1.0), Look(4, 4, 0.2, 1.0)], plan)
    assert d.outcome == "undecided" and d.look is None and d.final and d.alpha_spent == 0.025
    same = seq.decide([Look(3, 4, 0.5, 0.0)], plan)                 # every seed the same Δ: says nothing
    assert same.outcome == "undecided"
    repeat = seq.decide([Look(3, 4, 0.2, 1.0), Look(3, 4, 0.2, 1.0)], plan)   # no new seed: no new test
    assert repeat.alpha_spent == pytest.approx(seq.spending_function(3 / 4, 0.025, "obrien-fleming"))


def test_equivalence_needs_the_repeated_interval_inside_the_effect():
    plan = Plan(max_seeds=4, effect=0.5)
    bounds, _, _ = seq.boundaries([(3, 4), (4, 4)], plan)
    sd_for = lambda half: half * 2.0 / bounds[1]        # the RCI's half-width is c_2 · sd / √4
    inside = seq.decide([Look(3, 4, 0.0, 1.0), Look(4, 4, 0.01, sd_for(0.49 - 1e-3))], plan)
    outside = seq.decide([Look(3, 4, 0.0, 1.0), Look(4, 4, 0.01, sd_for(0.49 + 1e-3))], plan)
    assert (inside.outcome, inside.look) == ("equivalent", 2)
    assert outside.outcome == "undecided"


def test_paired_look_pairs_by_seed():
    look = seq.paired_look({0: 0.5, 1: 0.7, 2: 0.4}, {0: 0.3, 1: 0.6, 3: 0.9}, 8)
    assert (look.n, look.max_seeds) == (2, 8)
    assert look.mean == pytest.approx(0.15) and look.sd == pytest.approx(np.std([0.2, 0.1], ddof=1))
    assert seq.paired_look({0: 1.0}, {1: 1.0}, 8) is None


# ----------------------------------------------------------------------------- power
def test_fixed_power_matches_a_simulated_t_test():
    rng = np.random.default_rng(3)
    n, effect, sd = 6, 0.9, 1.3
    d = effect + sd * rng.standard_normal((200_000, n))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    simulated = np.mean(np.abs(t) >= stats.t.isf(0.025, n - 1))
    assert seq.fixed_power(effect, sd, n) == pytest.approx(simulated, abs=3 * math.sqrt(0.25 / 200_000) + 1e-3)
    assert seq.fixed_power(1.0, 1.0, 10) == pytest.approx(0.8031, abs=5e-5)   # one-sample t, d = 1, n = 10


def test_detectable_effect_and_seeds_needed_invert_the_power():
    effect = seq.detectable_effect(0.04, 5)
    assert seq.fixed_power(effect, 0.04, 5) == pytest.approx(0.8, abs=1e-9)
    n = seq.seeds_needed(0.05, 0.08)
    assert seq.fixed_power(0.05, 0.08, n) >= 0.8 > seq.fixed_power(0.05, 0.08, n - 1)
    assert seq.seeds_needed(0.0, 0.08) is None and seq.detectable_effect(0.0, 5) is None
    assert seq.seeds_needed(1e-6, 1.0) is None                       # beyond any sweep: say so, no number
    tighter = seq.detectable_effect(0.04, 5, critical=5.0)           # a strict sequential boundary
    assert tighter > effect


# ----------------------------------------------------------------------------- simulation
def test_null_contrasts_are_called_at_most_five_percent_overall():
    """20,000 sequential null contrasts (both sides from the same noise), 3 seeds then one per
    look up to 8: false helps + hurts ≤ 5% within Monte-Carlo error; each side ≤ 2.5%."""
    result = seq.simulate(Plan(), 0.0, 20_000, seed=101)
    wrong = result.positive + result.negative
    assert wrong <= 0.05 + 3 * result.standard_error(0.05)
    assert wrong >= 0.05 - 4 * result.standard_error(0.05)          # not trivially conservative either
    assert max(result.positive, result.negative) <= 0.025 + 3 * result.standard_error(0.025)
    beats = seq.simulate(Plan(), 0.0, 20_000, seed=102, two_sided=False)
    assert beats.positive <= 0.025 + 3 * beats.standard_error(0.025)


def test_a_true_effect_is_decided_with_fewer_seeds_than_a_fixed_design():
    """Δ = 1.5 × the seed SD: decided in most sequences, at fewer seeds on average than the
    fixed design that has the same power."""
    result = seq.simulate(Plan(), 1.5, 20_000, seed=103)
    assert result.positive > 0.6 and result.negative < 0.001
    fixed = seq.fixed_seeds_for_power(result.positive, 1.5)
    assert result.mean_seeds < fixed - 0.5, (result, fixed)


def test_raising_the_maximum_midway_keeps_the_rate_and_after_the_end_costs_some():
    midway = seq.simulate(Plan(), 0.0, 20_000, seed=104, raise_max_to=12, raised_after=5)
    assert midway.positive + midway.negative <= 0.05 + 3 * midway.standard_error(0.05)
    after = seq.simulate(Plan(), 0.0, 20_000, seed=104, raise_max_to=12)
    assert after.positive + after.negative > 0.05 + 3 * after.standard_error(0.05)   # why the report warns


def test_no_effect_claims_are_rarely_wrong():
    """At a true Δ exactly the named effect, "no effect ≥ X" is false; the repeated interval
    keeps that below alpha / 2."""
    result = seq.simulate(Plan(effect=1.0), 1.0, 20_000, seed=105)
    assert result.equivalent <= 0.025 + 3 * result.standard_error(0.025)
    null = seq.simulate(Plan(effect=2.0), 0.0, 20_000, seed=106)
    assert null.equivalent > 0.3                                      # and it does stop null contrasts
