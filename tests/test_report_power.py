"""The report's power section and first line, and a sequential sweep's verdicts decided by its
looks (grpo_ablate/report/power.py, verdicts.py), on synthetic sweep dirs with known numbers."""
import json
import math
import statistics

import numpy as np
import pytest

from scipy import stats

from report_fixtures import LOO, LOO_CONTRASTS, make_sweep
from grpo_ablate.stats import group_sequential as seq
from grpo_ablate.report.build import build_report
from grpo_ablate.report.render import render_markdown, report_json
from grpo_ablate.sweep import sequential as sweep_seq


def sequentialize(path, looks_at=(3, 4), max_seeds=8, effect=None):
    """Give a finished synthetic sweep the looks a `--seeds auto` sweep would have recorded:
    look k saw the seeds below looks_at[k], decided by the sweep's own functions."""
    manifest = json.loads((path / "manifest.json").read_text())
    all_runs = manifest["runs"]
    manifest["sequential"] = {"initial_seeds": looks_at[0], "max_seeds": max_seeds, "budget_s": None,
                              "effect": effect, "metric": "eval/accuracy", "higher_is_better": True,
                              "alpha": 0.05, "spending": "obrien-fleming", "elapsed_s": 0.0, "looks": [],
                              "stopped": {"reason": "budget"}}
    for k, upto in enumerate(looks_at, 1):
        manifest["runs"] = [r for r in all_runs if r["seed"] < upto]
        manifest["sequential"]["looks"].append({"look": k, "seed": None if k == 1 else upto - 1, "runs": [],
                                                "max_seeds": max_seeds, "wall_s": None, "seeds": None,
                                                "decisions": None})
        sweep_seq.record_decisions(manifest, sweep_seq.decide_look(path, manifest))
    (path / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def four_seeds(variants, extra):
    return {name: {**v, "final": {**v["final"], 3: extra[name]}} for name, v in variants.items()}


LOO4 = four_seeds(LOO, {"all": 0.83, "drop-a": 0.80, "drop-b": 0.84, "drop-c": 0.92})


def verdict(report, trick):
    return next(v for v in report.verdicts if v["trick"] == trick)


# ----------------------------------------------------------------------------- sequential sweeps
def test_a_sequential_sweep_is_decided_by_its_boundaries_not_the_fixed_interval(tmp_path):
    """After 4 of at most 8 seeds, trick a's fixed 95% CI excludes zero, but the O'Brien–Fleming
    boundary at look 2 is far stricter: the report must say undecided, as the sweep did."""
    path = make_sweep(tmp_path / "s", LOO4, seeds=(0, 1, 2, 3), contrasts=LOO_CONTRASTS)
    fixed = build_report(path)
    assert verdict(fixed, "a")["verdict"] == "helps" and verdict(fixed, "c")["verdict"] == "hurts"
    manifest = sequentialize(path)
    report = build_report(path)
    a = verdict(report, "a")
    assert a["verdict"] == "no evidence" and "undecided after 4 seeds (sequential)" in a["why"]
    d = np.array([0.80, 0.84, 0.82, 0.83]) - np.array([0.70, 0.75, 0.71, 0.80])
    bounds, _, _ = seq.boundaries([(3, 8), (4, 8)], seq.Plan())
    t = d.mean() / (d.std(ddof=1) / 2)
    assert stats.t.isf(0.025, 3) < t < bounds[1]          # past the fixed 5% test, inside the sequential boundary
    assert a["power"]["t"] == pytest.approx(t) and a["power"]["boundary"] == pytest.approx(bounds[1])
    assert a["power"]["seeds"] == 4 and a["power"]["look"] is None and a["power"]["sequential"]
    assert a["power"]["detectable_effect"] == pytest.approx(
        seq.detectable_effect(d.std(ddof=1), 4, critical=bounds[1]), rel=1e-6)
    c = verdict(report, "c")                             # Δ −0.09 at every seed, give or take 0.01: decided
    assert c["verdict"] == "hurts" and c["power"]["look"] == 2 and "at look 2 (4 seeds)" in c["why"]
    recorded = {x["name"]: x["outcome"] for x in manifest["sequential"]["looks"][-1]["decisions"]}
    assert (recorded["a"], recorded["c"]) == ("undecided", "hurts")                # the sweep agreed
    lines = render_markdown(report).splitlines()
    assert lines[2].startswith("- **Verdicts**: sequential, 2 look(s) up to 8 seeds, stopped: budget; "
                               "false helps/hurts ≤ 5% over all looks")
    assert lines[3].startswith("- **1 of 3 contrasts decided**")
    assert lines[5] == "| trick | Δ (with − without) [95% CI] | decided at look | verdict |"   # no adjusted p here
    assert "**The verdicts**: sequential: 2 look(s) up to 8 seeds, stopped: budget; " in render_markdown(report).split(
        "## How to read this")[1]


def test_a_contrast_decided_at_a_look_says_which(tmp_path):
    steady = {"all": {"tricks": ["a"], "reference": None, "final": {0: 0.80, 1: 0.84, 2: 0.82}},
              "drop-a": {"tricks": [], "reference": "all", "final": {0: 0.70, 1: 0.7405, 2: 0.7198}}}
    path = make_sweep(tmp_path / "s", steady, contrasts=[{"trick": "a", "with": "all", "without": "drop-a"}])
    sequentialize(path, looks_at=(3,))
    a = verdict(build_report(path), "a")
    assert a["verdict"] == "helps" and "crossed the sequential boundary at look 1 (3 seeds)" in a["why"]
    assert (a["power"]["look"], a["power"]["seeds"]) == (1, 3)
    assert "**1 of 1 contrasts decided**" not in render_markdown(build_report(path))
    head = render_markdown(build_report(path)).splitlines()[:6]
    assert head[2].startswith("- **Verdicts**: sequential, 1 look(s)") and head[3] == "- **All 1 contrasts decided.**"
    lower = verdict(build_report(path, higher_is_better=False), "a")                # not the sweep's direction
    assert lower["verdict"] == "hurts" and not lower["power"]["sequential"]
    assert "decided its looks on `eval/accuracy` (higher is better)" in render_markdown(
        build_report(path, higher_is_better=False))


def test_sequential_beats_the_control_is_one_sided(tmp_path):
    variants = {"all": {"tricks": ["a"], "reference": None, "final": {0: 0.80, 1: 0.84, 2: 0.82}},
                "drop-a": {"tricks": [], "reference": "all", "final": {0: 0.81, 1: 0.80, 2: 0.83}}}
    controls = {"base": {"final": {0: 0.5, 1: 0.51, 2: 0.495}}}
    path = make_sweep(tmp_path / "s", variants, contrasts=[{"trick": "a", "with": "all", "without": "drop-a"}],
                      controls=controls)
    sequentialize(path, looks_at=(3,), max_seeds=3)      # one look, the last: a fixed one-sided test at 2.5%
    report = build_report(path)
    against = {c["variant"]: c for c in report.against_controls}
    assert against["all"]["outcome"] == "beats" and "one-sided sequential boundary at look 1" in against["all"]["why"]
    d = np.array([0.80, 0.84, 0.82]) - np.array([0.5, 0.51, 0.495])
    assert d.mean() / (d.std(ddof=1) / math.sqrt(3)) >= seq.boundaries([(3, 3)], seq.Plan(max_seeds=3), False)[0][0]


# ----------------------------------------------------------------------------- fixed sweeps
def test_fixed_sweep_power_and_the_cost_of_deciding_the_rest(tmp_path):
    # hand-computed paired intervals: the paired test (--test paired); the blocked model: test_report_blocked.py
    path = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    report = build_report(path, test="paired")
    b = verdict(report, "b")
    assert b["verdict"] == "no evidence" and b["power"]["look"] is None and not b["power"]["sequential"]
    d = np.array([0.80, 0.84, 0.82]) - np.array([0.85, 0.80, 0.83])
    sd = d.std(ddof=1)
    assert b["power"]["sd"] == pytest.approx(sd) and b["power"]["seeds"] == 3
    assert b["power"]["se"] == pytest.approx(sd / math.sqrt(3)) and b["power"]["df"] == 2
    # a and c are decided: Holm leaves b the level 0.05 / (3 - 2), and its own test is the paired t with 2 df
    assert b["power"]["level"] == 0.05
    se = sd / math.sqrt(3)
    assert b["power"]["detectable_effect"] == pytest.approx(planned(se, 2, 0.05, 2), rel=1e-6)
    assert b["power"]["detectable_effect"] > seq.detectable_effect(sd, 3)   # a variance from 2 df is not the truth
    assert verdict(report, "a")["power"]["look"] == 1                 # a fixed sweep decides at its one look
    # b's interval spans 0: the report has no reason to decide it, so no price (post-hoc power on its
    # observed |Δ| 0.007 would say 362 seeds)
    p = report.power
    assert b["power"]["seeds_needed"] is None and b["power"]["reason"] is None
    assert p["extra_seeds"] == {} and p["unpriced"] == [] and p["priced"] == [] and p["runs"] == 0
    # nor in the Run summaries (every summary's Δ: the same rule), where a decided one keeps its price
    for s in report.summaries:
        row = {c["trick"]: c for c in s["contrasts"]}
        assert row["b"]["seeds_needed"] is None, s["summary"]
    detectable = b["power"]["detectable_effect"]
    assert p["detectable"] == [detectable, detectable]
    text = render_markdown(report)
    first, cost = text.splitlines()[2:4]
    assert first == ("- **Verdicts**: 3 tests, Holm, 5% family-wise (paired t per contrast); compared on each run's "
                     "final `eval/accuracy` (higher is better).")
    assert cost == (f"- **2 of 3 contrasts decided**; the open ones' test detects |Δ| ≥ {detectable:.3f} with 80% "
                    "power (see Power).")
    assert ("**The verdicts**: 3 contrasts, 3 tests, Holm, 5%: the chance of any false *helps*, *hurts* or *breaks "
            "training* in this report ≤ 5%; paired t per contrast.") in text.split("## How to read this")[1]
    assert "1 open contrast without a price: an interval that spans 0 (or none, no spread) is no reason" in \
        text.split("## Power")[1]
    # with the smallest effect that matters named, the open one is priced: seeds × variants × the median run
    priced = build_report(path, effect=0.05, test="paired")
    p = priced.power
    needed_for = next(m for m in range(3, 2000) if planned_power(0.05, se * math.sqrt(3 / m), m - 1, 0.05, 2) >= 0.8)
    assert verdict(priced, "b")["power"]["seeds_needed"] == needed_for
    walls = [10.0 + s for s in (0, 1, 2)] * 4                         # the fixture's wall_time_s
    assert (p["decided"], p["contrasts"]) == (2, 3)
    assert p["extra_seeds"] == {"all": needed_for - 3, "drop-b": needed_for - 3} and p["runs"] == 2 * (needed_for - 3)
    assert p["seconds"] == pytest.approx(p["runs"] * statistics.median(walls))
    priced_text = render_markdown(priced)
    assert (f"; deciding b: about {2 * (needed_for - 3)} more runs (up to {needed_for - 3} more "
            "seeds for 2 variants) ≈ ") in priced_text.splitlines()[3]
    assert (f"Deciding b would take about {2 * (needed_for - 3)} more runs (up to {needed_for - 3} more "
            "seeds for 2 variants)") in priced_text.split("## Power")[1]
    table = priced_text.split("## Power")[1]
    assert f"| b | no evidence | 3 | — | -0.007 | {sd / math.sqrt(3):.3f} | {detectable:.3f} | ~{needed_for} |" in table
    assert json.loads(json.dumps(report_json(priced)))["verdicts"][1]["power"]["seeds_needed"] == needed_for
    final = next(s for s in priced.summaries if s["summary"] == "final")     # --effect is a reason everywhere
    assert {c["trick"]: c for c in final["contrasts"]}["b"]["seeds_needed"] == seq.seeds_needed(0.05, sd)


def planned_power(effect, se, df, level, info):
    """planning_power by scipy.stats: the noncentral t's power averaged over 48 quantiles of the variance."""
    x = stats.chi2.ppf((np.arange(48) + 0.5) / 48, info) / info
    c = stats.t.ppf(1 - level / 2, df)
    ncp = [effect * math.sqrt(q) / se for q in x]
    # far from the centre scipy.stats.nct's tails come out NaN: there they are 1 and 0
    return float(np.mean([np.nan_to_num(stats.nct.sf(c, df, m), nan=1.0) + np.nan_to_num(stats.nct.cdf(-c, df, m))
                          for m in ncp]))


def planned(se, df, level, info):
    from scipy import optimize

    return optimize.brentq(lambda e: planned_power(e, se, df, level, info) - 0.8, 1e-9, 20 * se, xtol=1e-12)


def test_the_power_of_the_reports_own_test_is_scipys_noncentral_t():
    from scipy import stats

    from grpo_ablate.report.power import detectable_delta, planning_power, t_power

    for se, df, level in ((0.01, 24.0, 0.05 / 6), (0.02, 4.0, 0.05), (0.005, 10.7, 0.01)):
        c = stats.t.ppf(1 - level / 2, df)
        for effect in (0.0, 0.5 * se, 3 * se):
            theirs = stats.nct.sf(c, df, effect / se) + stats.nct.cdf(-c, df, effect / se)
            assert t_power(effect, se, df, level) == pytest.approx(theirs, abs=1e-9)
        found = detectable_delta(se, df, level)
        assert t_power(found, se, df, level) == pytest.approx(0.8, abs=1e-9)
        assert planning_power(found, se, df, level, 1e6) == pytest.approx(0.8, abs=1e-3)   # a variance known
        for info in (4.0, 8.0):
            assert planning_power(2 * se, se, df, level, info) == pytest.approx(
                planned_power(2 * se, se, df, level, info), abs=1e-7)
            assert detectable_delta(se, df, level, info=info) > found


def test_effect_turns_a_tight_interval_into_no_effect_and_sizes_the_seeds(tmp_path):
    # hand-computed paired intervals: the paired test (--test paired); the blocked model: test_report_blocked.py
    path = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    # the no-effect claim is made on the family's Bonferroni interval (98.3% for 3 tests): the 95% CI
    # [-0.119, +0.105] lies inside ±0.2 but the 98.3% one [-0.206, +0.192] does not
    b = verdict(build_report(path, effect=0.2, test="paired"), "b")
    assert -0.2 < b["delta"].low and b["delta"].high < 0.2 and b["verdict"] == "no evidence"
    b = verdict(build_report(path, effect=0.25, test="paired"), "b")
    assert b["verdict"] == "no effect" and "no effect ≥ 0.25" in b["why"] and "98.33% CI" in b["why"]
    assert b["power"]["look"] == 1 and b["power"]["seeds_needed"] is None      # decided: nothing to price
    # the CI is wider than ±0.05
    assert verdict(build_report(path, effect=0.05, test="paired"), "b")["verdict"] == "no evidence"
