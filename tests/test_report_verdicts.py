"""Verdicts per trick (helps / hurts / no evidence / no verdict / breaks training) and
variants against the controls, on sweeps whose every number is known.
"""
import math
import shutil

import pytest

from grpo_ablate.report.build import build_report
from grpo_ablate.report.render import render_markdown, variants_table
from report_fixtures import ALL, CONTROLS, LOO, LOO_CONTRASTS, SFT, T_975, hand_ci, make_sweep


def test_cis_deltas_and_verdicts(tmp_path):
    # hand-computed paired intervals: the paired test (--test paired); the blocked model: test_report_blocked.py
    report = build_report(make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS), test="paired")
    rows = {r["variant"]: r for r in report.rows}
    mean, low, high = hand_ci(list(ALL.values()), T_975[2])        # 0.82 ± 0.049683
    final = rows["all"]["final"]
    assert (final.mean, final.low, final.high, final.n) == pytest.approx((mean, low, high, 3), abs=1e-5)
    assert high - mean == pytest.approx(4.302653 * 0.02 / math.sqrt(3), abs=1e-5)
    # accuracy is linear from 0.5, so the area under the curve is the midpoint
    assert rows["all"]["auc"].mean == pytest.approx((0.5 + 0.82) / 2, abs=1e-9)
    # Δ vs reference is variant − reference, paired by seed
    diffs = [LOO["drop-a"]["final"][s] - ALL[s] for s in (0, 1, 2)]   # -0.10, -0.09, -0.11
    d = rows["drop-a"]["delta"]
    assert (d.mean, d.low, d.high) == pytest.approx(hand_ci(diffs, T_975[2]), abs=1e-6)
    assert "paired" in d.basis
    assert rows["all"]["delta"] is None
    assert rows["all"]["length"] == 12.0 and rows["all"]["kl"] == pytest.approx(0.01)
    assert rows["all"]["wall_time_s"] == pytest.approx(11.0)

    verdicts = {v["trick"]: v for v in report.verdicts}
    assert verdicts["a"]["verdict"] == "helps"
    assert verdicts["a"]["delta"].mean == pytest.approx(0.10, abs=1e-9)
    assert verdicts["a"]["delta"].low == pytest.approx(0.10 - 4.302653 * 0.01 / math.sqrt(3), abs=1e-6)
    b_diffs = [ALL[s] - LOO["drop-b"]["final"][s] for s in (0, 1, 2)]
    b_mean, b_low, b_high = hand_ci(b_diffs, T_975[2])
    assert b_low < 0 < b_high
    assert (verdicts["b"]["delta"].low, verdicts["b"]["delta"].high) == pytest.approx((b_low, b_high), abs=1e-6)
    assert verdicts["b"]["verdict"] == "no evidence"
    assert verdicts["c"]["verdict"] == "hurts"

    text = render_markdown(report)
    assert "**a**: *helps*" in text and "**b**: *no evidence*" in text and "**c**: *hurts*" in text
    assert f"0.820 ± {high - mean:.3f}" in text
    assert "No flag fired." in text
    # the same numbers with the metric read as a cost flip helps and hurts
    flipped = {v["trick"]: v["verdict"]
               for v in build_report(tmp_path / "s", higher_is_better=False, test="paired").verdicts}
    assert flipped == {"a": "hurts", "b": "no evidence", "c": "helps"}



def test_zero_spread_over_seeds_is_no_verdict(tmp_path):
    # 16 eval problems: accuracy moves in steps of 1/16, and two seeds can agree exactly
    variants = {"all": {"tricks": ["a", "b"], "reference": None, "final": {0: 0.5, 1: 0.5}},
                "drop-a": {"tricks": ["b"], "reference": "all", "final": {0: 0.5625, 1: 0.5625}},
                "drop-b": {"tricks": ["a"], "reference": "all", "final": {0: 0.5, 1: 0.5}}}
    contrasts = [{"trick": t, "with": "all", "without": f"drop-{t}"} for t in "ab"]
    report = build_report(make_sweep(tmp_path / "s", variants, seeds=(0, 1), contrasts=contrasts))
    verdicts = {v["trick"]: v for v in report.verdicts}
    assert verdicts["a"]["delta"].low == verdicts["a"]["delta"].high == pytest.approx(-0.0625)
    assert verdicts["a"]["verdict"] == "no verdict" and "zero width" in verdicts["a"]["why"]
    # the same metrics at every seed on both sides: the trick changed nothing (not "no evidence")
    assert verdicts["b"]["verdict"] == "inert here" and "identical metrics at every shared seed" in verdicts["b"]["why"]


def test_a_trick_whose_activity_metric_stayed_zero_is_inert_here(tmp_path):
    """Δ differs (other randomness), but the trick's own activity metric shows it never acted:
    overlong filtering that masked nothing, an adaptive KL whose beta never moved."""
    import yaml

    curves = {"overlong__masked_frac": lambda s: 0.0, "kl__beta": lambda s: 0.04}
    variants = {"all": {"tricks": ["overlong_filter", "kl_adaptive"], "reference": None, "curves": curves,
                        "final": {0: 0.8, 1: 0.9, 2: 0.85}},
                "drop-overlong_filter": {"tricks": ["kl_adaptive"], "reference": "all",
                                         "final": {0: 0.5, 1: 0.55, 2: 0.6}},
                "drop-kl_adaptive": {"tricks": ["overlong_filter"], "reference": "all",
                                     "final": {0: 0.7, 1: 0.6, 2: 0.65}}}
    contrasts = [{"trick": t, "with": "all", "without": f"drop-{t}"} for t in ("overlong_filter", "kl_adaptive")]
    sweep = make_sweep(tmp_path / "s", variants, contrasts=contrasts)
    info = {"overlong_filter": {"family": "overlong", "option": "filter"},
            "kl_adaptive": {"family": "kl", "option": "adaptive"}}
    for run in (tmp_path / "s").glob("all-s*"):
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        cfg["tricks"] = info
        (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    verdicts = {v["trick"]: v for v in build_report(sweep).verdicts}
    assert verdicts["overlong_filter"]["verdict"] == "inert here"
    assert "overlong/masked_frac stayed 0 in every run with it (3)" in verdicts["overlong_filter"]["why"]
    assert verdicts["kl_adaptive"]["verdict"] == "inert here"
    assert "kl/beta never changed" in verdicts["kl_adaptive"]["why"]
    # the same runs with the filter masking something at one step: the numbers decide again
    for run in (tmp_path / "s").glob("all-s*"):
        lines = (run / "metrics.jsonl").read_text().splitlines()
        lines[5] = lines[5].replace('"overlong/masked_frac": 0.0', '"overlong/masked_frac": 0.25')
        (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert {v["trick"]: v["verdict"] for v in build_report(sweep).verdicts}["overlong_filter"] == "helps"


def test_breaks_training(tmp_path):
    # every run with x diverges at step 12; none without it does: 4 of 4 vs 0 of 4 is Boschloo's
    # one-sided p = 0.0039, the family's only test (y is inert)
    seeds = (0, 1, 2, 3)
    broken = {"final": {}, "state": {s: "diverged" for s in seeds}, "diverge_at": {s: 12 for s in seeds}}
    variants = {
        "all": {"tricks": ["x", "y"], "reference": None, **broken},
        "drop-x": {"tricks": ["y"], "reference": "all", "final": {0: 0.8, 1: 0.82, 2: 0.8, 3: 0.81}},
        "drop-y": {"tricks": ["x"], "reference": "all", **broken},
    }
    contrasts = [{"trick": t, "with": "all", "without": f"drop-{t}"} for t in "xy"]
    report = build_report(make_sweep(tmp_path / "s", variants, seeds=seeds, contrasts=contrasts))
    verdicts = {v["trick"]: v for v in report.verdicts}
    assert verdicts["x"]["verdict"] == "breaks training"
    assert "4 of 4 with it, 0 of 4 without" in verdicts["x"]["why"] and "diverged@12" in verdicts["x"]["why"]
    assert verdicts["x"]["broke"]["p"] == pytest.approx(0.00390625)
    # broken with and without y, identically at every seed: y changed nothing
    assert verdicts["y"]["verdict"] == "inert here"
    text = render_markdown(report)
    assert "4 diverged@12,12,12,12" in text and "*breaks training*" in text
    assert "| all-s0 | all | 0 | diverged | 12 |" in text


def test_one_seed_gives_no_verdict_not_even_breaks_training(tmp_path):
    # one run that broke against one that did not is no evidence that the trick breaks training
    # (the exact test's smallest p at 1 vs 1 is 0.25): counted and said, not decided
    variants = {
        "all": {"tricks": ["a", "z"], "reference": None, "final": {0: 0.80}},
        "drop-a": {"tricks": ["z"], "reference": "all", "final": {0: 0.60}},
        "drop-z": {"tricks": ["a"], "reference": "all", "final": {0: 0.78}},
        "+z": {"tricks": ["a", "z", "w"], "reference": "all", "final": {}, "state": {0: "diverged"},
               "diverge_at": {0: 7}},
    }
    contrasts = [{"trick": "a", "with": "all", "without": "drop-a"},
                 {"trick": "z", "with": "all", "without": "drop-z"},
                 {"trick": "w", "with": "+z", "without": "all"}]
    report = build_report(make_sweep(tmp_path / "s", variants, seeds=(0,), contrasts=contrasts))
    verdicts = {v["trick"]: v["verdict"] for v in report.verdicts}
    assert verdicts == {"a": "no verdict", "z": "no verdict", "w": "no verdict"}
    assert "runs that broke: 1 of 1 with it, 0 of 1 without" in report.verdicts[2]["why"]
    text = render_markdown(report)
    verdict_section = section(text, "Verdicts per trick")
    for word in ("*helps*", "*hurts*", "*no evidence*"):
        assert word not in verdict_section
    assert "one seed" in verdict_section
    assert "0.800 (n=1, no CI)" in text


# --------------------------------------------------------------------------- controls


def against(report):
    return {(c["variant"], c["role"]): c for c in report.against_controls}


def section(text, title):
    return text.split(f"## {title}")[1].split("\n## ")[0]


def test_control_rows_and_deltas(tmp_path):
    # hand-computed paired intervals: the paired test (--test paired); the blocked model: test_report_blocked.py
    report = build_report(make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS, controls=CONTROLS), test="paired")
    rows = {r["variant"]: r for r in report.rows}
    assert [r["variant"] for r in report.rows] == list(LOO) + ["control-base", "control-sft"]
    assert report.controls == {"base": "control-base", "sft": "control-sft"}
    assert rows["control-base"]["kind"] == rows["control-sft"]["kind"] == "control"
    assert rows["control-base"]["final"].mean == 0.5 and rows["control-base"]["final"].low == 0.5   # flat
    # Δ vs base: paired over seeds 0, 1, 2 (every treatment and the control have them)
    for name, v in LOO.items():
        diffs = [v["final"][s] - 0.5 for s in (0, 1, 2)]
        d = rows[name]["delta_vs_base"]
        assert (d.mean, d.low, d.high) == pytest.approx(hand_ci(diffs, T_975[2]), abs=1e-6) and "paired" in d.basis
    # Δ vs SFT by hand: all − sft = −0.03, −0.01, +0.01 -> −0.01 ± 4.302653 × 0.02 / √3
    d = rows["all"]["delta_vs_sft"]
    assert (d.mean, d.low, d.high) == pytest.approx((-0.01, -0.01 - 4.302653 * 0.02 / math.sqrt(3),
                                                     -0.01 + 4.302653 * 0.02 / math.sqrt(3)), abs=1e-6)
    diffs = [LOO["drop-c"]["final"][s] - SFT[s] for s in (0, 1, 2)]                  # +0.07, +0.08, +0.10
    assert (rows["drop-c"]["delta_vs_sft"].low, rows["drop-c"]["delta_vs_sft"].high) == \
        pytest.approx(hand_ci(diffs, T_975[2])[1:], abs=1e-6)
    # the SFT control against the base; a control against itself has no Δ
    assert rows["control-sft"]["delta_vs_base"].mean == pytest.approx(0.33)
    assert rows["control-base"]["delta_vs_base"] is None and rows["control-sft"]["delta_vs_sft"] is None
    # the tricks' own verdicts and Δ vs reference are untouched; no control is in a contrast
    assert {v["trick"]: v["verdict"] for v in report.verdicts} == {"a": "helps", "b": "no evidence", "c": "hurts"}
    assert rows["drop-a"]["delta"].mean == pytest.approx(-0.10)
    assert rows["control-sft"]["reference"] is None and rows["control-sft"]["delta"] is None

    table = variants_table(report)
    header = table.splitlines()[0]
    assert "| Δ vs reference | Δ vs base | Δ vs SFT control | length |" in header
    lines = {line.split(" | ")[0][2:]: line for line in table.splitlines()[2:]}
    assert set(lines) == set(LOO) | {"control-base (control)", "control-sft (control)"}
    base_half = 4.302653 * 0.02 / math.sqrt(3)
    assert f"| +0.320 ± {base_half:.3f} | -0.010 ± {base_half:.3f} |" in lines["all"]
    assert "| no training |" in lines["control-base (control)"]
    assert "| supervised on reference solutions, tokens budget |" in lines["control-sft (control)"]
    assert "| control | " in lines["control-base (control)"] and "+0.330 ± " in lines["control-sft (control)"]


def test_against_the_controls_verdicts(tmp_path):
    # hand-computed paired intervals: the paired test (--test paired); the blocked model: test_report_blocked.py
    report = build_report(make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS, controls=CONTROLS), test="paired")
    vs = against(report)
    assert {(v, r): c["outcome"] for (v, r), c in vs.items()} == {
        ("all", "base"): "beats", ("all", "sft"): "not shown",             # CI spans zero
        ("drop-a", "base"): "beats", ("drop-a", "sft"): "not shown",       # below the SFT control
        ("drop-b", "base"): "beats", ("drop-b", "sft"): "not shown",
        ("drop-c", "base"): "beats", ("drop-c", "sft"): "beats"}           # clearly above both
    assert "worse" in vs["drop-a", "sft"]["why"] and "≥ 0.05 (8 tests, Holm, 5%)" in vs["all", "sft"]["why"]
    assert not any(c["variant"].startswith("control") for c in report.against_controls)
    text = render_markdown(report)
    lines = {line.split("**")[1]: line for line in section(text, "Against the controls").splitlines()
             if line.startswith("- **")}
    assert "does not beat the SFT control" in lines["drop-a"] and "RL not shown to help here" in lines["drop-a"]
    assert "RL not shown to help here" in lines["all"]
    assert "beats the untrained base" in lines["drop-c"] and "beats the SFT control" in lines["drop-c"]
    assert "not shown" not in lines["drop-c"] and "does not beat" not in lines["drop-c"]
    assert "The SFT control itself vs the untrained base: Δ = +0.330" in section(text, "Against the controls")
    # drop-c beats the SFT control: no "no variant beats" line at the top
    assert "No variant beats the SFT control" not in text
    # controls sit in the Variants section, never in the trick verdicts
    assert "control" not in section(text, "Verdicts per trick")

    # a stronger SFT control and a better base: nothing beats SFT; drop-a is not above the base
    strong = {"base": {"final": {0: 0.71, 1: 0.71, 2: 0.71}}, "sft": {"final": {0: 0.95, 1: 0.96, 2: 0.95}}}
    report = build_report(make_sweep(tmp_path / "strong", LOO, contrasts=LOO_CONTRASTS, controls=strong), test="paired")
    text = render_markdown(report)
    assert section(text, "Against the controls").lstrip().startswith(   # the controls' own headline, below the verdicts
        "**No variant beats the SFT control (`control-sft`) on `eval/accuracy`: RL not shown to help here**")
    assert "No variant beats" not in text.split("## Verdicts per trick")[0]
    lines = {line.split("**")[1]: line for line in section(text, "Against the controls").splitlines()
             if line.startswith("- **")}
    assert all("RL not shown to help here" in lines[v] for v in LOO)
    # drop-a − base = −0.01, +0.04, 0.00: a positive mean, but the CI spans zero, so not shown
    drop_a = against(report)["drop-a", "base"]
    assert drop_a["delta"].mean > 0 and drop_a["delta"].low < 0 and drop_a["outcome"] == "not shown"
    assert "not shown to beat the untrained base" in lines["drop-a"]
    # all − base = +0.09, +0.13, +0.11: one-sided p = 0.0095, but one of 8 comparisons (Holm): not shown;
    # without error control the 95% CI lies above zero and it would be called
    assert against(report)["all", "base"]["outcome"] == "not shown" and "8 tests, Holm" in lines["all"]
    alone = against(build_report(tmp_path / "strong", error_control="none", test="paired"))["all", "base"]
    assert alone["outcome"] == "beats" and alone["delta"].low > 0
    # a cost metric flips the direction: below the control is better
    flipped = against(build_report(tmp_path / "strong", higher_is_better=False, test="paired"))
    assert flipped["drop-a", "sft"]["outcome"] == "beats" and flipped["drop-a", "sft"]["delta"].high < 0


def test_controls_with_one_seed_give_point_estimates_only(tmp_path):
    controls = {"base": {"final": {0: 0.5}}, "sft": {"final": {0: 0.6}}}
    report = build_report(make_sweep(tmp_path / "s", LOO, seeds=(0,), contrasts=LOO_CONTRASTS,
                                         controls=controls))
    assert all(c["beats"] is None and c["outcome"] == "not shown" for c in report.against_controls)
    text = render_markdown(report)
    part = section(text, "Against the controls")
    assert "one seed: no comparison is possible beyond the point estimate" in part
    assert "Δ = +0.300" in part                                                        # drop-c − sft, 0.90 − 0.60
    assert "With one seed per variant no comparison with the controls is possible beyond point estimates." in part
    top = part.lstrip().splitlines()[0]
    assert "RL not shown to help here**" in top and "(One seed: point estimates only" in top
    assert "0.300 (n=1, no CI)" in variants_table(report)


def test_missing_control_runs_make_no_claim(tmp_path):
    # the SFT control is in the manifest but never ran: a column of dashes, no RL claim
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS, controls=CONTROLS)
    for seed in (0, 1, 2):
        shutil.rmtree(sweep / f"control-sft-s{seed}")
    report = build_report(sweep)
    assert all(c["outcome"] == "no comparison" for c in report.against_controls if c["role"] == "sft")
    text = render_markdown(report)
    assert "Δ vs SFT control" in text and "RL not shown" not in text and "No variant beats" not in text
    assert "no comparison with the SFT control (the control has no completed run)" in text
    # a metric the control does not log (an SFT run samples no reward) is said, not guessed
    rows = {r["variant"]: r for r in build_report(make_sweep(tmp_path / "r", LOO, controls=CONTROLS),
                                                       metric="reward/mean").rows}
    assert rows["all"]["delta_vs_sft"].mean is None and rows["all"]["delta_vs_base"].mean is not None



def test_known_answers_of_a_variants_file_are_checked(tmp_path):
    """A `variants` sweep file's `expect`: the report says, per known-answer variant, whether
    its verdict is one a correct report gives, and how many it got right."""
    variants = {
        "default": {"tricks": [], "reference": None, "final": ALL},
        # 0.10 lower at every seed (± 0.01): hurts, as expected
        "cold": {"tricks": [], "reference": "default", "final": {0: 0.70, 1: 0.75, 2: 0.71},
                 "expect": ["hurts"]},
        # Δ spans zero: no evidence, but the file claims it helps — the report must say WRONG
        "noise": {"tricks": [], "reference": "default", "final": {0: 0.85, 1: 0.80, 2: 0.83},
                  "expect": ["helps"]},
        "plain": {"tricks": [], "reference": "default", "final": {0: 0.85, 1: 0.80, 2: 0.83}},
    }
    contrasts = [{"trick": n, "with": n, "without": "default"} for n in ("cold", "noise", "plain")]
    report = build_report(make_sweep(tmp_path / "s", variants, contrasts=contrasts, mode="variants"))
    by = {v["trick"]: v for v in report.verdicts}
    assert (by["cold"]["verdict"], by["cold"]["expected"], by["cold"]["as_expected"]) == ("hurts", ["hurts"], True)
    assert (by["noise"]["verdict"], by["noise"]["as_expected"]) == ("no evidence", False)
    assert "expected" not in by["plain"]          # no known answer claimed: nothing checked
    text = render_markdown(report)
    assert "**1 of 2 known answers right**" in text
    assert "- cold: *hurts*, expected *hurts*: right" in text
    assert "- noise: *no evidence*, expected *helps*: WRONG" in text


def with_rft(tmp_path, rft_final):
    """The LOO sweep with all three controls, its training checked against its start (as every sweep
    planned now is)."""
    import json

    controls = {**CONTROLS, "rft": {"final": rft_final}}
    sweep = make_sweep(tmp_path, LOO, contrasts=LOO_CONTRASTS, controls=controls)
    manifest = json.loads((sweep / "manifest.json").read_text())
    (sweep / "manifest.json").write_text(json.dumps({**manifest, "checks_training": True}))
    return build_report(sweep, test="paired")


def test_the_rft_control_leads_the_controls_and_the_training_line(tmp_path):
    """With an RFT control, not beating it (not SFT) is what says RL is not shown to help; the
    gold-SFT comparison stays, framed as imitation; the line above the verdicts names RFT."""
    report = with_rft(tmp_path / "strong", {0: 0.95, 1: 0.96, 2: 0.95})
    assert report.controls == {"base": "control-base", "sft": "control-sft", "rft": "control-rft"}
    text = render_markdown(report)
    controls = section(text, "Against the controls")
    assert controls.lstrip().startswith(
        "**No variant beats the RFT control (`control-rft`) on `eval/accuracy`: the policy gradient not shown to "
        "beat rejection sampling here**")
    assert "No variant beats imitation of the task's gold solutions (`control-sft`, the same budget)." in controls
    lines = {line.split("**")[1]: line for line in controls.splitlines() if line.startswith("- **")}
    assert all("does not beat the RFT control" in lines[v] for v in LOO)
    assert all(lines[v].endswith("— **the policy gradient not shown to beat rejection sampling here**.") for v in LOO)
    assert "RL not shown to help here" not in text
    assert "- The RFT control itself vs the untrained base: Δ = +0.453" in controls
    head = text.split("| trick |")[0]
    assert "**Training vs its untrained start and rejection sampling (RFT" in head
    assert "**not shown to beat RFT** (Δ = -0.133 [" in head
    assert "| Δ vs RFT control |" in variants_table(report)
    assert "| control-rft (control) | supervised on its own verified-correct samples" in variants_table(report)


def test_variants_that_beat_the_rft_control_are_named_first(tmp_path):
    report = with_rft(tmp_path / "weak", {0: 0.40, 1: 0.41, 2: 0.40})
    beat = sorted(v for (v, role), c in against(report).items() if role == "rft" and c["outcome"] == "beats")
    assert beat, "a control far below every variant is beaten"
    text = render_markdown(report)
    assert section(text, "Against the controls").lstrip().startswith(
        "**" + ", ".join(f"`{v}`" for v in beat) + f" beat{'s' if len(beat) == 1 else ''} the RFT control")
    assert "**it beats RFT**" in text.split("| trick |")[0]
