"""Run summaries (report --summary), compute–performance fits and predicted verdicts.

Synthetic curves with known parameters: ScaleRL's sigmoid against compute, written as the
trainer writes metrics.jsonl (eval points, and per step the sampled and trained token counts).
"""
import json
import math

import numpy as np
import pandas as pd
import pytest

from grpo_ablate.report import build_report
from grpo_ablate.report.curves import Curve, Summary, curve
from grpo_ablate.report.fits import CEILING_TOLERANCE, fit, pooled, sigmoid
from grpo_ablate.report.render import render_markdown, report_json
from grpo_ablate.report.scaling import (DRIFTS_MORE, FASTER, LOWERS, NEITHER, POOR_FITS, RAISES, SAME_CEILING,
                                        SELECTED)
from grpo_ablate.sweep.sequential import read_finals
from report_fixtures import LOO, LOO_CONTRASTS, make_sweep

TOKENS = 1000          # per step: 600 sampled + 400 trained
STEPS, EVERY, N_EVAL = 40, 2, 2000


def sigmoid_rows(R0, A, B, C_mid, steps=STEPS, every=EVERY, noise=None, tokens=TOKENS):
    """metrics.jsonl rows whose eval follows the sigmoid at compute = tokens × step (+ noise)."""
    rows = [{"step": 0, "eval/accuracy": R0}]
    for s in range(1, steps + 1):
        row = {"step": s, "loss": 0.1, "perf/sampled_tokens": 0.6 * tokens, "perf/completion_tokens": 0.4 * tokens}
        if s % every == 0 or s == steps:
            value = float(sigmoid(tokens * s, R0, A, B, C_mid)) + (noise(s) if noise else 0.0)
            row["eval/accuracy"] = min(max(value, 0.0), 1.0)
        rows.append(row)
    return rows


def frame(rows):
    return pd.DataFrame(rows)


def write_rows(run_dir, rows, steps=STEPS, every=EVERY):
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = run_dir / "config.yaml"
    text = cfg.read_text().replace(f"steps: {40}\n", f"steps: {steps}\n")
    cfg.write_text(text + f"eval:\n  every: {every}\ntask:\n  eval_size: {N_EVAL}\n")


def curve_sweep(path, params, seeds=(0, 1, 2, 3, 4), noise_sd=0.004):
    """A leave-one-out sweep of one trick `t`: variant -> (A, B, C_mid) of its curves; each seed
    shifts A by a common seed effect and adds independent eval noise."""
    finals = {name: {s: 0.5 for s in seeds} for name in params}
    variants = {"all": {"tricks": ["t"], "reference": None, "final": finals["all"]},
                "drop-t": {"tricks": [], "reference": "all", "final": finals["drop-t"]}}
    make_sweep(path, variants, seeds=seeds, contrasts=[{"trick": "t", "with": "all", "without": "drop-t"}])
    rng = np.random.default_rng(7)
    seed_shift = {s: rng.normal(0, 0.01) for s in seeds}
    for name, (A, B, C_mid) in params.items():
        for s in seeds:
            eps = np.random.default_rng(100 * s + len(name))
            write_rows(path / f"{name}-s{s}", sigmoid_rows(0.3, A + seed_shift[s], B, C_mid,
                                                           noise=lambda step: eps.normal(0, noise_sd)))
    return path


def drifting_sweep(path, drop, start, seeds=(0, 1, 2, 3, 4), noise_sd=0.004):
    """Both arms rise alike to the same peak (A 0.85 by about step 10); from `start` the runs with
    the trick drift down linearly, by `drop` at the last step (a late drift seen on the default sweep)."""
    sweep = curve_sweep(path, {"all": (0.85, 3.0, 5_000.0), "drop-t": (0.85, 3.0, 5_000.0)}, seeds, noise_sd)
    for s in seeds:
        eps = np.random.default_rng(1000 + s)
        late = lambda step: -drop * min(max((step - start) / (STEPS - start), 0.0), 1.0)
        write_rows(sweep / f"all-s{s}", sigmoid_rows(0.3, 0.85, 3.0, 5_000.0,
                                                     noise=lambda step: late(step) + eps.normal(0, noise_sd)))
    return sweep


# --------------------------------------------------------------------------- summaries
def test_summary_parse_and_refusals():
    assert Summary.parse("final") == Summary("final")
    assert Summary.parse("last_5") == Summary("last_k", 5)
    assert Summary.parse("last_k", 2).label == "last_2"
    assert Summary.parse("AUC").label == "auc"
    for bad in ("mean", "last_0", "", "last_"):
        with pytest.raises(ValueError, match="allowed|k >= 1"):
            Summary.parse(bad)


def test_summaries_by_hand_on_a_compute_axis():
    # evals at steps 0, 2, 4; step 3 cost three times the others (dynamic sampling's extra rounds)
    rows = [{"step": 0, "eval/accuracy": 0.2},
            {"step": 1, "perf/sampled_tokens": 60, "perf/completion_tokens": 40},
            {"step": 2, "perf/sampled_tokens": 60, "perf/completion_tokens": 40, "eval/accuracy": 0.6},
            {"step": 3, "perf/sampled_tokens": 260, "perf/completion_tokens": 40},
            {"step": 4, "perf/sampled_tokens": 60, "perf/completion_tokens": 40, "eval/accuracy": 0.5}]
    m = frame(rows)
    points = curve(m, "eval/accuracy")
    assert points.unit == "tokens"
    assert points.compute.tolist() == [0, 200, 600]
    assert Summary("final")(m, "eval/accuracy") == 0.5
    assert Summary("best")(m, "eval/accuracy") == 0.6
    assert Summary("best")(m, "eval/accuracy", higher_is_better=False) == 0.2
    assert Summary("last_k", 2)(m, "eval/accuracy") == pytest.approx(0.55)
    # trapezoid over compute: (0.2+0.6)/2*200 + (0.6+0.5)/2*400 = 80 + 220, over 600
    assert Summary("auc")(m, "eval/accuracy") == pytest.approx(300 / 600)
    # without token counts the axis is the step (older runs are reported as before)
    old = frame([{k: v for k, v in r.items() if not k.startswith("perf/")} for r in rows])
    assert curve(old, "eval/accuracy").unit == "steps"
    assert Summary("auc")(old, "eval/accuracy") == pytest.approx(((0.2 + 0.6) / 2 * 2 + (0.6 + 0.5) / 2 * 2) / 4)
    assert Summary("final")(old, "nothing") is None
    # --compute wall: the seconds the training steps took (time/step_s), step 3 the slow one again
    timed = frame([{**r, **({"time/step_s": 3.0 if r["step"] == 3 else 1.0} if r["step"] else {})} for r in rows])
    wall = curve(timed, "eval/accuracy", "wall")
    assert wall.unit == "seconds" and wall.compute.tolist() == [0, 2, 6]
    assert Summary("auc").of(wall) == pytest.approx((0.8 / 2 * 2 + 1.1 / 2 * 4) / 6)


# --------------------------------------------------------------------------- fits
@pytest.mark.parametrize("A,B,C_mid", [(0.8, 1.5, 12_000.0), (0.65, 3.0, 6_000.0), (0.95, 0.8, 20_000.0)])
def test_fit_recovers_known_parameters(A, B, C_mid):
    m = frame(sigmoid_rows(0.3, A, B, C_mid))
    f = fit(curve(m, "eval/accuracy"), N_EVAL)
    assert f.ok, f.why
    assert f.A == pytest.approx(A, abs=1e-4)
    assert f.B == pytest.approx(B, rel=1e-3)
    assert f.C_mid == pytest.approx(C_mid, rel=1e-3)
    assert f.R0 == 0.3 and f.rmse < 1e-6


def test_fit_with_eval_noise_stays_within_the_seed_spread():
    rng = np.random.default_rng(0)
    errors = []
    for _ in range(20):
        m = frame(sigmoid_rows(0.3, 0.8, 2.0, 6_000.0, noise=lambda s: rng.normal(0, 0.01)))
        f = fit(curve(m, "eval/accuracy"), N_EVAL)
        assert f.ok, f.why
        errors.append(f.A - 0.8)
    # a curve that bends inside the data (98% of the gain by the last eval): ScaleRL's tolerance
    # for "the same A" is 0.02, and eval noise of 0.01 moves A well inside it
    assert max(abs(e) for e in errors) < CEILING_TOLERANCE


def test_a_fixed_refit_fits_only_B_and_C_mid():
    m = frame(sigmoid_rows(0.3, 0.8, 1.5, 12_000.0))
    f = fit(curve(m, "eval/accuracy"), N_EVAL, A=0.8)
    assert f.A == 0.8 and f.B == pytest.approx(1.5, rel=1e-3)
    g = fit(curve(m, "eval/accuracy"), N_EVAL, A=0.82)     # a shared A a little off still fits, B moves
    assert g.A == 0.82 and g.B != pytest.approx(1.5, rel=1e-3)


def test_poor_fits_say_why():
    flat = frame([{"step": s, "eval/accuracy": 0.5 + (0.002 if s % 4 == 0 else 0.0)} for s in range(0, 41, 2)])
    f = fit(curve(flat, "eval/accuracy"), N_EVAL)
    assert not f.ok and f.why.startswith("flat")
    falling = frame(sigmoid_rows(0.8, 0.3, 1.5, 12_000.0))
    f = fit(curve(falling, "eval/accuracy"), N_EVAL)
    assert not f.ok and f.why.startswith("falling")
    rise_fall = frame([{"step": s, "eval/accuracy": 0.3 + 0.6 * math.sin(math.pi * s / 40)} for s in range(0, 41, 2)])
    f = fit(curve(rise_fall, "eval/accuracy"), N_EVAL)      # peaks and falls: unstable, before any other reason
    assert not f.ok and f.why.startswith("unstable: peaks at 0.900 (step 20)") and f.excluded == "drifting"
    zigzag = frame(sigmoid_rows(0.3, 0.8, 3.0, 6_000.0, noise=lambda s: 0.03 * (-1) ** (s // 2)))
    f = fit(curve(zigzag, "eval/accuracy"), N_EVAL)         # jumps, but no lasting drop below its peak
    assert not f.ok and "not sigmoid-shaped" in f.why and f.excluded == "poor fit" and not f.drift.drifting
    early = frame(sigmoid_rows(0.3, 0.95, 1.0, 100_000.0))      # the midpoint is 2.5x past the last eval
    f = fit(curve(early, "eval/accuracy"), N_EVAL)
    assert not f.ok and "beyond the compute measured" in f.why
    short = frame(sigmoid_rows(0.3, 0.8, 1.5, 12_000.0, steps=4))
    f = fit(curve(short, "eval/accuracy"), N_EVAL)
    assert not f.ok and "too few" in f.why
    no_base = Curve(np.array([2.0, 4.0, 6.0]), np.array([1.0, 2.0, 3.0]), np.array([0.4, 0.5, 0.6]))
    assert fit(no_base).why.startswith("no base eval")


def test_a_rise_before_the_first_eval_leaves_B_unidentified_but_measures_A():
    m = frame(sigmoid_rows(0.3, 0.8, 4.0, 600.0, every=4))     # the gain is all in by the first eval (4000)
    f = fit(curve(m, "eval/accuracy"), N_EVAL)
    assert f.ok and f.A == pytest.approx(0.8, abs=1e-3)
    assert not f.B_identified and f.c_first == 4 * TOKENS
    assert fit(curve(frame(sigmoid_rows(0.3, 0.8, 1.5, 12_000.0)), "eval/accuracy"), N_EVAL).B_identified


def test_pooled_curve_takes_every_seed_and_the_mean_base():
    a = curve(frame(sigmoid_rows(0.3, 0.8, 1.5, 12_000.0)), "eval/accuracy")
    b = curve(frame(sigmoid_rows(0.32, 0.8, 1.5, 12_000.0)), "eval/accuracy")
    p = pooled([a, b])
    assert len(p) == len(a) + len(b) - 1 and p.values[0] == pytest.approx(0.31)
    assert np.all(np.diff(p.compute) >= 0)


# --------------------------------------------------------------------------- split verdicts
def test_a_higher_ceiling_is_called_raises_the_ceiling(tmp_path):
    sweep = curve_sweep(tmp_path / "s", {"all": (0.85, 1.5, 12_000.0), "drop-t": (0.75, 1.5, 12_000.0)})
    c = build_report(sweep).fits["contrasts"][0]
    assert c["both_ok"] == 5 and c["B_identified"] == 5 and c["dA"].mean == pytest.approx(0.10, abs=0.01)
    assert c["ceiling"] == RAISES and c["split"].startswith(RAISES)
    flipped = curve_sweep(tmp_path / "f", {"all": (0.75, 1.5, 12_000.0), "drop-t": (0.85, 1.5, 12_000.0)})
    assert build_report(flipped).fits["contrasts"][0]["ceiling"] == LOWERS


def test_a_steeper_curve_at_the_same_ceiling_learns_faster(tmp_path):
    sweep = curve_sweep(tmp_path / "s", {"all": (0.8, 3.0, 12_000.0), "drop-t": (0.8, 1.2, 12_000.0)})
    c = build_report(sweep).fits["contrasts"][0]
    assert c["ceiling"] == SAME_CEILING
    assert c["speed"] == FASTER and c["split"] == FASTER
    assert c["dB"].mean == pytest.approx(math.log(3.0 / 1.2), rel=0.1)


def test_identical_curves_split_as_neither(tmp_path):
    sweep = curve_sweep(tmp_path / "s", {"all": (0.8, 1.5, 12_000.0), "drop-t": (0.8, 1.5, 12_000.0)})
    c = build_report(sweep).fits["contrasts"][0]
    assert c["split"] == NEITHER and c["ceiling"] in (SAME_CEILING, None)


def test_a_drifting_arm_is_unstable_not_a_lower_ceiling(tmp_path):
    """A late drift of −0.08 used to be called *lowers the ceiling*; every run with the
    trick peaks and falls here, so each is unstable, the arm drifts, exclusion differs by arm."""
    report = build_report(drifting_sweep(tmp_path / "s", drop=0.08, start=14))
    c = report.fits["contrasts"][0]
    assert c["excluded"]["with"]["drifting"] == 5 and c["excluded"]["without"]["drifting"] == 0
    assert c["drift"] == DRIFTS_MORE and c["drift_p"]["with"] < 0.05 and c["exclusion_p"] < 0.05
    assert c["ceiling"] is None and c["split"] == f"{DRIFTS_MORE} and {SELECTED}"
    v = {row["variant"]: row for row in report.fits["variants"]}
    assert v["all"]["unstable"] and not v["drop-t"]["unstable"] and v["all"]["ok"] == 0
    text = render_markdown(report)
    assert f"**{DRIFTS_MORE} and {SELECTED}**" in text and "- t: withheld, the runs with the trick drift" in text
    assert "**unstable**: 5 of 5 runs drift" in text and "5 drifting / 0 (p = 0.008)" in text
    assert LOWERS not in text.split("## Compute–performance fits")[1].split("##")[0]
    data = report_json(report)
    json.dumps(data)
    assert data["fits"]["variants"][0]["runs_fit"]["0"]["drift"]["window"] == 7


def test_poor_fits_give_no_split_and_the_report_says_so(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)   # linear curves: midpoint beyond the data
    report = build_report(sweep)
    assert all(c["split"] == POOR_FITS for c in report.fits["contrasts"])
    text = render_markdown(report)
    assert "## Compute–performance fits" in text and "**poor fits**" in text
    json.dumps(report_json(report))          # the fits serialise


def test_fits_do_not_apply_to_a_lower_is_better_metric(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    report = build_report(sweep, higher_is_better=False)
    assert not report.fits["applicable"] and "lower-is-better" in report.fits["why"]
    assert "Not fitted" in render_markdown(report)


# --------------------------------------------------------------------------- the compared summary
def test_final_is_the_default_and_asking_for_it_changes_nothing(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    default, final = build_report(sweep), build_report(sweep, summary="final")
    strip = lambda r: json.dumps(report_json(r), sort_keys=True, default=str)
    assert strip(default) == strip(final)
    assert [v["verdict"] for v in default.verdicts] == ["helps", "no evidence", "hurts"]
    assert "Compared:" not in render_markdown(default)


def test_another_summary_decides_on_its_own_numbers(tmp_path):
    # the linear fixture curves: auc of 0.5 -> f over 40 steps is (0.5 + f) / 2, so Δauc = Δfinal / 2
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    final, auc = build_report(sweep), build_report(sweep, summary="auc")
    for f, a in zip(final.verdicts, auc.verdicts):
        assert a["delta"].mean == pytest.approx(f["delta"].mean / 2)
        assert a["verdict"] == f["verdict"]
    row = next(r for r in auc.rows if r["variant"] == "drop-a")
    assert row["delta"].mean == pytest.approx((0.72 - 0.82) / 2)
    text = render_markdown(auc)
    assert "**Compared: each run's auc**" in text and "Δ auc eval/accuracy" in text
    best = build_report(sweep, summary="best")        # rising curves: best is final
    assert [v["delta"].mean for v in best.verdicts] == pytest.approx([v["delta"].mean for v in final.verdicts])
    table = {s["summary"]: s for s in final.summaries}
    assert set(table) == {"final", "auc", "best", "last_3"} and table["final"]["chosen"]
    assert table["auc"]["contrasts"][0]["sd"] == pytest.approx(table["final"]["contrasts"][0]["sd"] / 2)
    assert "## Run summaries" in render_markdown(final)


def test_sequential_looks_read_the_summary_they_were_planned_with(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    manifest = json.loads((sweep / "manifest.json").read_text())
    finals, _ = read_finals(sweep, manifest, "eval/accuracy")
    areas, _ = read_finals(sweep, manifest, "eval/accuracy", "auc")
    assert finals["drop-a"][0] == pytest.approx(0.70)
    assert areas["drop-a"][0] == pytest.approx((0.5 + 0.70) / 2)


# --------------------------------------------------------------------------- predictions
def test_half_a_run_predicts_the_final_verdict(tmp_path):
    sweep = curve_sweep(tmp_path / "s", {"all": (0.85, 1.5, 8_000.0), "drop-t": (0.75, 1.5, 8_000.0)})
    report = build_report(sweep, predict_from=0.5)
    p = report.predictions["contrasts"][0]
    assert p["verdict"] == "helps" and p["measured"] == "helps"
    assert p["delta"].mean == pytest.approx(report.verdicts[0]["delta"].mean, abs=0.02)
    assert report.predictions["how"] == {"fit": 10}
    text = render_markdown(report)
    assert "**Forecasts, not verdicts**" in text and "decided: 1 of 1 agree; undecided: 0 of 0" in text
    assert "the measured Δ lies inside the forecast interval in 1 of 1 contrast(s)" in text
    # the interval carries the extrapolation's error: wider than the seeds' alone
    assert p["delta"].high - p["delta"].low > p["seeds_only"].high - p["seeds_only"].low
    assert report_json(report)["predictions"]["agreement"] == {"decided": [1, 1], "undecided": [0, 0],
                                                               "covered": [1, 1]}


def test_forecasts_that_miss_a_late_effect_claim_no_agreement_on_it(tmp_path):
    """The runs with the trick fall by 0.1 after half of training: from the first half, the
    forecast sees nothing; the measurement says *hurts*. The report must not count agreeing on
    nothing as agreeing: decided 0 of 1, and the measured Δ outside the forecast interval."""
    report = build_report(drifting_sweep(tmp_path / "s", drop=0.1, start=STEPS // 2), predict_from=0.5)
    assert report.verdicts[0]["verdict"] == "hurts"
    p = report.predictions["contrasts"][0]
    assert p["verdict"] == "no evidence" and p["measured"] == "hurts"
    text = render_markdown(report)
    assert "decided: 0 of 1 agree; undecided: 0 of 0" in text
    assert "the measured Δ lies inside the forecast interval in 0 of 1 contrast(s)" in text
    assert "*no evidence* (forecast)" in text and "forecast (not a verdict)" in text
    assert report_json(report)["predictions"]["agreement"]["decided"] == [0, 1]


def test_a_running_sweep_is_predicted_and_marked(tmp_path):
    sweep = curve_sweep(tmp_path / "s", {"all": (0.85, 1.5, 8_000.0), "drop-t": (0.75, 1.5, 8_000.0)})
    for s in range(5):     # every run stopped at step 20 of 40, still running
        run = sweep / f"all-s{s}"
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["step"] <= 20))
        status = json.loads((run / "status.json").read_text())
        (run / "status.json").write_text(json.dumps({**status, "state": "running", "step": 20}))
    report = build_report(sweep)
    assert report.predictions["running"] == 5 and report.predictions["fraction"] is None
    assert report.predictions["contrasts"][0]["verdict"] == "helps"
    assert "measured" not in report.predictions["contrasts"][0]
    assert "(forecast)" in render_markdown(report)


def test_a_finished_sweep_has_no_predictions_unless_asked(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    assert build_report(sweep).predictions is None
    assert "## Predicted verdicts" not in render_markdown(build_report(sweep))


# --------------------------------------------------------------------------- rliable aggregates
def test_iqm_and_probability_of_improvement_by_hand():
    from grpo_ablate.stats.aggregate import aggregate_iqm, probability_of_improvement

    est = aggregate_iqm({"t1": [0.0, 1.0, 2.0, 3.0], "t2": [4.0, 5.0, 6.0, 100.0]})
    assert est.mean == pytest.approx(np.mean([2.0, 3.0, 4.0, 5.0]))      # the middle half of 8 scores
    assert est.low <= est.mean <= est.high
    # every x beats every y in t1; in t2 of the pairs (1,2) (1,3) (3,2) (3,3): one win, one tie -> 1.5 / 4
    p = probability_of_improvement({"t1": [3, 4], "t2": [1, 3]}, {"t1": [1, 2], "t2": [2, 3]})
    assert p.mean == pytest.approx((1.0 + 1.5 / 4) / 2)
    assert probability_of_improvement({"t": [1, 2]}, {"t": [3, 4]}, higher_is_better=False).mean == 1.0
    # stratified: a task's runs are resampled within it, so a one-task shift stays in its task
    same = aggregate_iqm({"t1": [0.5, 0.5, 0.5]})
    assert same.mean == 0.5 and not same.has_ci


def test_the_report_carries_the_aggregates(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    report = build_report(sweep)
    a = {c["trick"]: c["improvement"] for c in report.aggregates["contrasts"]}
    assert a["a"].mean == 1.0 and a["c"].mean == 0.0            # every run with a beats every run without
    assert "## Aggregates (rliable)" in render_markdown(report)


# --------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize("args, message", [
    (["--summary", "mean"], "summary 'mean' is not allowed; allowed: final, auc, best, last_k"),
    (["--summary", "last_0"], "last_k needs k >= 1"),
    (["--last-k", "4"], "--last-k 4 belongs to --summary last_k (or give --summary last_4)"),
    (["--predict-from", "1.5"], "--predict-from 1.5 is not allowed; it must be a number in (0, 1)"),
    (["--compute", "flops"], "--compute 'flops' is not allowed; allowed: tokens, wall"),
])
def test_bad_summary_options_are_one_line_and_write_nothing(args, message, tmp_path):
    from test_sweep import cli_here

    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    before = sorted(p.name for p in sweep.iterdir())
    r = cli_here("report", str(sweep), *args, cwd=tmp_path)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert sorted(p.name for p in sweep.iterdir()) == before


@pytest.mark.full
def test_report_cli_compares_the_summary_it_is_given(tmp_path):
    from test_sweep import cli_here

    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    r = cli_here("report", str(sweep), "--summary", "last_k", "--last-k", "2", "--format", "json", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    data = json.loads((sweep / "report.json").read_text())
    assert data["summary"] == "last_2" and "summary" in data["variants"][0]
    # the linear fixture curves evaluated at steps 30 and 40: the mean of the last two
    a = {v["trick"]: v["delta"]["mean"] for v in data["verdicts"]}["a"]
    assert a == pytest.approx(((0.82 - 0.72) * 0.75 + (0.82 - 0.72)) / 2, abs=1e-9)


def test_a_run_that_logged_a_nan_metric_is_left_out_and_said(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    path = sweep / "all-s0" / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[-1]["eval/accuracy"] = float("nan")            # json.dumps writes NaN, as the trainer would
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = build_report(sweep)
    row = next(r for r in report.rows if r["variant"] == "all")
    assert row["final"].n == 2                           # seeds 1 and 2 only, not an earlier eval of seed 0
    assert report.verdicts[0]["delta"].n == 2
    text = render_markdown(report)
    assert "`eval/accuracy` is not finite at step 40: this run is left out of every statistic" in text
