"""`grpo-ablate report` on synthetic sweep dirs with known numbers.

The fixture builder writes exactly what the trainer and the sweep command write (the run-dir
contract and manifest version 1), with eval accuracy rising linearly from 0.5 to a chosen
final value, so every final value, AUC, CI and Δ below can be computed by hand.
"""
import io
import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import REPO, cli
from grpo_ablate import report as rep
from grpo_ablate.report import Flag, HealthThresholds, health_flags, metrics_frame

T_975 = {2: 4.302653, 3: 3.182446}   # Student-t 0.975 quantiles from tables
STEPS, MAX_NEW = 40, 32


# --------------------------------------------------------------------------- fixture builder
def metric_rows(final=0.8, steps=STEPS, eval_every=10, diverge_at=None, **curves):
    """metrics.jsonl rows: eval/accuracy linear from 0.5 (step 0) to `final` (last step);
    `curves` maps a column (with '__' for '/') to a function of the step."""
    acc = lambda s: 0.5 + (final - 0.5) * s / steps
    rows = [{"step": 0, "eval/accuracy": acc(0), "eval/length_mean": 12.0, "eval/truncated_frac": 0.0}]
    for s in range(1, (diverge_at or steps) + 1):
        row = {"step": s, "loss": 0.1, "reward/mean": 0.5 + s / 100, "reward/std": 0.4, "train/accuracy": 0.6,
               "length/mean": 12.0, "length/max": 20, "length/truncated_frac": 0.0, "policy/entropy": 0.8,
               "kl/beta": 0.04, "kl/k1": 0.01, "kl/k3": 0.01, "optim/grad_norm": 0.5, "time/step_s": 0.2}
        row.update({name.replace("__", "/"): f(s) for name, f in curves.items()})
        if s == diverge_at:
            row.update({"loss": None, "optim/grad_norm": None})
        elif s % eval_every == 0 or s == steps:
            row.update({"eval/accuracy": acc(s), "eval/length_mean": 12.0, "eval/truncated_frac": 0.0})
        rows.append(row)
    return rows


def control_rows(role, final, seed, steps=STEPS, eval_every=10):
    """metrics.jsonl rows of a control run, with the keys the control trainer writes.
    base: the starting policy never trained, so its greedy eval/accuracy is `final` at every
    eval, while its sampled reward/mean differs by seed. sft: eval/accuracy linear from 0.5
    to `final`, like a GRPO run, with a supervised loss and no RL columns."""
    acc = (lambda s: final) if role == "base" else (lambda s: 0.5 + (final - 0.5) * s / steps)
    rows = [{"step": 0, "eval/accuracy": acc(0), "eval/length_mean": 12.0, "eval/truncated_frac": 0.0}]
    for s in range(1, steps + 1):
        if role == "base":
            row = {"step": s, "reward/mean": 0.45 + 0.02 * seed + 0.01 * (s % 3), "reward/std": 0.4,
                   "train/accuracy": 0.5, "length/mean": 12.0 + seed, "length/max": 20,
                   "length/truncated_frac": 0.0}
        else:
            row = {"step": s, "loss": 1.0 / (1 + s), "optim/grad_norm": 0.5, "optim/lr": 1e-4,
                   "perf/completion_tokens": 128}
        row.update({"time/step_s": 0.1, "time/elapsed_s": 0.1 * s})
        if s % eval_every == 0 or s == steps:
            row.update({"eval/accuracy": acc(s), "eval/length_mean": 12.0, "eval/truncated_frac": 0.0})
        rows.append(row)
    return rows


def write_run(run_dir, variant, seed, tricks=(), rows=None, state="completed", samples=None,
              status=True, config=True, mode="leave-one-out", control=None):
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = metric_rows() if rows is None else rows
    if rows:
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if samples is not None:
        (run_dir / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    last = rows[-1]["step"] if rows else 0
    if status:
        reason = f"non-finite loss at step {last}" if state == "diverged" else None
        (run_dir / "status.json").write_text(json.dumps({
            "state": state, "step": last, "reason": reason, "wall_time_s": 10.0 + seed,
            "config_hash": "ab12", "wandb_id": None, "updated_at": "2026-11-30T05:40:00+0000"}))
    if config:
        cfg = {"seed": seed, "steps": STEPS, "rollout": {"max_new_tokens": MAX_NEW},
               "tricks": {t: {"family": "x", "option": t} for t in tricks},
               "run": {"name": f"{variant}-s{seed}", "group": "g-1", "job_type": variant},
               "logger": {"name": "wandb", "project": "grpo-ablate", "entity": None, "mode": "auto"},
               "sweep": {"name": "loo", "id": "1", "mode": mode, "variant": variant, "tricks": []}}
        if control is not None:
            cfg["control"] = {"name": control, "budget": "tokens"}
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))


def make_sweep(path, variants, seeds=(0, 1, 2), contrasts=None, manifest=True, mode="leave-one-out",
               controls=None):
    """variants: name -> {"tricks": [...], "reference": name|None, "final": {seed: acc},
    optional "state": {seed: state}, "diverge_at": {seed: step}, "curves": {...}}.
    controls: role (base | sft) -> {"final": {seed: acc}}: adds the variants control-<role>
    (kind control, runs written by `control_rows`) and the manifest's `controls` map."""
    path.mkdir(parents=True, exist_ok=True)
    runs = []
    variants = dict(variants)
    for role, c in (controls or {}).items():
        variants[f"control-{role}"] = {"tricks": [], "reference": None, "final": c["final"], "kind": "control",
                                       "control": role, "overrides": [f"control={role}"]}
    for name, v in variants.items():
        for seed in seeds:
            if seed not in v["final"] and seed not in v.get("state", {}):
                continue
            state = v.get("state", {}).get(seed, "completed")
            diverge_at = v.get("diverge_at", {}).get(seed)
            if v.get("control"):
                rows = control_rows(v["control"], v["final"].get(seed, 0.5), seed)
            else:
                rows = metric_rows(v["final"].get(seed, 0.5), diverge_at=diverge_at, **v.get("curves", {}))
            write_run(path / f"{name}-s{seed}", name, seed, v["tricks"], rows, state, mode=mode,
                      control=v.get("control"))
            runs.append({"variant": name, "seed": seed, "run_dir": f"{name}-s{seed}", "config_hash": "ab12",
                         "status": "completed", "step": STEPS, "reason": None, "final_accuracy": None,
                         "overrides": []})
    if manifest:
        extra = {"controls": {role: f"control-{role}" for role in controls}} if controls else {}
        (path / "manifest.json").write_text(json.dumps({
            "version": 1, "sweep_id": "2026-11-30_05-40-00", "name": "loo", "mode": mode, "base": "grpo",
            "tricks": sorted({t for v in variants.values() for t in v["tricks"]}), "seeds": list(seeds),
            "overrides": ["steps=40"], "launcher": "joblib", "wandb_group": "loo-2026-11-30_05-40-00",
            "created_at": "x", "updated_at": "x",
            "variants": [{"name": n, "tricks_on": v["tricks"], "overrides": v.get("overrides", []),
                          "reference": v.get("reference"),
                          "kind": v.get("kind", "treatment")} for n, v in variants.items()],
            "contrasts": contrasts or [], "runs": runs, **extra}))
    return path


# A leave-one-out sweep of three tricks: a helps, b is noise, c hurts.
ALL = {0: 0.80, 1: 0.84, 2: 0.82}
LOO = {
    "all": {"tricks": ["a", "b", "c"], "reference": None, "final": ALL},
    "drop-a": {"tricks": ["b", "c"], "reference": "all", "final": {0: 0.70, 1: 0.75, 2: 0.71}},
    "drop-b": {"tricks": ["a", "c"], "reference": "all", "final": {0: 0.85, 1: 0.80, 2: 0.83}},
    "drop-c": {"tricks": ["a", "b"], "reference": "all", "final": {0: 0.90, 1: 0.93, 2: 0.91}},
}
LOO_CONTRASTS = [{"trick": t, "with": "all", "without": f"drop-{t}"} for t in "abc"]


def hand_ci(values, t):
    x = np.array(values)
    half = t * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean(), x.mean() - half, x.mean() + half


# --------------------------------------------------------------------------- statistics
def test_t_quantile_matches_tables():
    for df, t in [(1, 12.706205), (2, 4.302653), (3, 3.182446), (4, 2.776445), (30, 2.042272)]:
        assert rep.t_quantile(0.975, df) == pytest.approx(t, abs=1e-6)
    assert rep.t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)
    assert 2.776445 < rep.t_quantile(0.975, 3.5) < 3.182446   # fractional df (Welch) in between


def test_cis_deltas_and_verdicts(tmp_path):
    report = rep.build_report(make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS))
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

    text = rep.render_markdown(report)
    assert "**a**: *helps*" in text and "**b**: *no evidence*" in text and "**c**: *hurts*" in text
    assert f"0.820 ± {high - mean:.3f}" in text
    assert "No flag fired." in text
    # the same numbers with the metric read as a cost flip helps and hurts
    flipped = {v["trick"]: v["verdict"] for v in rep.build_report(tmp_path / "s", higher_is_better=False).verdicts}
    assert flipped == {"a": "hurts", "b": "no evidence", "c": "helps"}


def test_welch_when_seeds_differ(tmp_path):
    variants = {"base": {"tricks": [], "reference": None, "final": {0: 0.60, 1: 0.64, 2: 0.62}},
                "+x": {"tricks": ["x"], "reference": "base", "final": {0: 0.75, 1: 0.80}}}
    report = rep.build_report(make_sweep(tmp_path / "s", variants, mode="add-one-in",
                                         contrasts=[{"trick": "x", "with": "+x", "without": "base"}]))
    d = report.verdicts[0]["delta"]
    a, b = np.array([0.75, 0.80]), np.array([0.60, 0.64, 0.62])
    va, vb = a.var(ddof=1) / 2, b.var(ddof=1) / 3
    df = (va + vb) ** 2 / (va ** 2 / 1 + vb ** 2 / 2)
    half = rep.t_quantile(0.975, df) * math.sqrt(va + vb)
    assert "Welch" in d.basis
    assert (d.mean, d.low, d.high) == pytest.approx((0.155, 0.155 - half, 0.155 + half), abs=1e-9)
    assert report.verdicts[0]["verdict"] == "no evidence"   # n=2 on one side: a wide interval


def test_zero_spread_over_seeds_is_no_verdict(tmp_path):
    # 16 eval problems: accuracy moves in steps of 1/16, and two seeds can agree exactly
    variants = {"all": {"tricks": ["a", "b"], "reference": None, "final": {0: 0.5, 1: 0.5}},
                "drop-a": {"tricks": ["b"], "reference": "all", "final": {0: 0.5625, 1: 0.5625}},
                "drop-b": {"tricks": ["a"], "reference": "all", "final": {0: 0.5, 1: 0.5}}}
    contrasts = [{"trick": t, "with": "all", "without": f"drop-{t}"} for t in "ab"]
    report = rep.build_report(make_sweep(tmp_path / "s", variants, seeds=(0, 1), contrasts=contrasts))
    verdicts = {v["trick"]: v for v in report.verdicts}
    assert verdicts["a"]["delta"].low == verdicts["a"]["delta"].high == pytest.approx(-0.0625)
    assert verdicts["a"]["verdict"] == "no verdict" and "zero width" in verdicts["a"]["why"]
    assert verdicts["b"]["verdict"] == "no evidence"        # Δ = 0 exactly: the interval is {0}


def test_breaks_training(tmp_path):
    # every run with x diverges at step 12; none without it does
    variants = {
        "all": {"tricks": ["x", "y"], "reference": None, "final": {}, "state": {0: "diverged", 1: "diverged"},
                "diverge_at": {0: 12, 1: 12}},
        "drop-x": {"tricks": ["y"], "reference": "all", "final": {0: 0.8, 1: 0.82}},
        "drop-y": {"tricks": ["x"], "reference": "all", "final": {}, "state": {0: "diverged", 1: "diverged"},
                   "diverge_at": {0: 12, 1: 12}},
    }
    contrasts = [{"trick": t, "with": "all", "without": f"drop-{t}"} for t in "xy"]
    report = rep.build_report(make_sweep(tmp_path / "s", variants, seeds=(0, 1), contrasts=contrasts))
    verdicts = {v["trick"]: v for v in report.verdicts}
    assert verdicts["x"]["verdict"] == "breaks training"
    assert "2 of 2 runs with it broke" in verdicts["x"]["why"] and "diverged@12" in verdicts["x"]["why"]
    assert verdicts["y"]["verdict"] == "no verdict"          # broken with and without y
    text = rep.render_markdown(report)
    assert "2 diverged@12,12" in text and "*breaks training*" in text
    assert "| all-s0 | all | 0 | diverged | 12 |" in text


def test_one_seed_gives_no_verdict_but_breaks_training(tmp_path):
    variants = {
        "all": {"tricks": ["a", "z"], "reference": None, "final": {0: 0.80}},
        "drop-a": {"tricks": ["z"], "reference": "all", "final": {0: 0.60}},
        "drop-z": {"tricks": ["a"], "reference": "all", "final": {0: 0.80}},
        "+z": {"tricks": ["a", "z", "w"], "reference": "all", "final": {}, "state": {0: "diverged"},
               "diverge_at": {0: 7}},
    }
    contrasts = [{"trick": "a", "with": "all", "without": "drop-a"},
                 {"trick": "z", "with": "all", "without": "drop-z"},
                 {"trick": "w", "with": "+z", "without": "all"}]
    report = rep.build_report(make_sweep(tmp_path / "s", variants, seeds=(0,), contrasts=contrasts))
    verdicts = {v["trick"]: v["verdict"] for v in report.verdicts}
    assert verdicts == {"a": "no verdict", "z": "no verdict", "w": "breaks training"}
    text = rep.render_markdown(report)
    verdict_section = text.split("## Verdicts per trick")[1].split("## Health flags")[0]
    for word in ("*helps*", "*hurts*", "*no evidence*"):
        assert word not in verdict_section
    assert "one seed" in verdict_section
    assert "0.800 (n=1, no CI)" in text


# --------------------------------------------------------------------------- controls (issue 8)
# The LOO sweep above with both controls: the untrained base evaluates flat at 0.5 on every
# seed (greedy eval of a fixed policy); the SFT control ends near `all`.
SFT = {0: 0.83, 1: 0.85, 2: 0.81}
CONTROLS = {"base": {"final": {0: 0.5, 1: 0.5, 2: 0.5}}, "sft": {"final": SFT}}


def against(report):
    return {(c["variant"], c["role"]): c for c in report.against_controls}


def section(text, title):
    return text.split(f"## {title}")[1].split("\n## ")[0]


def test_control_rows_and_deltas(tmp_path):
    report = rep.build_report(make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS, controls=CONTROLS))
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

    table = rep.variants_table(report)
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
    report = rep.build_report(make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS, controls=CONTROLS))
    vs = against(report)
    assert {(v, r): c["outcome"] for (v, r), c in vs.items()} == {
        ("all", "base"): "beats", ("all", "sft"): "not shown",             # CI spans zero
        ("drop-a", "base"): "beats", ("drop-a", "sft"): "not shown",       # below the SFT control
        ("drop-b", "base"): "beats", ("drop-b", "sft"): "not shown",
        ("drop-c", "base"): "beats", ("drop-c", "sft"): "beats"}           # clearly above both
    assert "worse" in vs["drop-a", "sft"]["why"] and "spans zero" in vs["all", "sft"]["why"]
    assert not any(c["variant"].startswith("control") for c in report.against_controls)
    text = rep.render_markdown(report)
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
    report = rep.build_report(make_sweep(tmp_path / "strong", LOO, contrasts=LOO_CONTRASTS, controls=strong))
    text = rep.render_markdown(report)
    assert text.splitlines()[2] == ("**No variant beats the SFT control (`control-sft`) on `eval/accuracy`: "
                                    "RL not shown to help here.**")
    lines = {line.split("**")[1]: line for line in section(text, "Against the controls").splitlines()
             if line.startswith("- **")}
    assert all("RL not shown to help here" in lines[v] for v in LOO)
    # drop-a − base = −0.01, +0.04, 0.00: a positive mean, but the CI spans zero, so not shown
    drop_a = against(report)["drop-a", "base"]
    assert drop_a["delta"].mean > 0 and drop_a["delta"].low < 0 and drop_a["outcome"] == "not shown"
    assert "not shown to beat the untrained base" in lines["drop-a"]
    assert "not shown to beat the untrained base" not in lines["all"]                # +0.09, +0.13, +0.11
    # a cost metric flips the direction: below the control is better
    flipped = against(rep.build_report(tmp_path / "strong", higher_is_better=False))
    assert flipped["drop-a", "sft"]["outcome"] == "beats" and "below zero" in flipped["drop-a", "sft"]["why"]


def test_controls_with_one_seed_give_point_estimates_only(tmp_path):
    controls = {"base": {"final": {0: 0.5}}, "sft": {"final": {0: 0.6}}}
    report = rep.build_report(make_sweep(tmp_path / "s", LOO, seeds=(0,), contrasts=LOO_CONTRASTS,
                                         controls=controls))
    assert all(c["beats"] is None and c["outcome"] == "not shown" for c in report.against_controls)
    text = rep.render_markdown(report)
    part = section(text, "Against the controls")
    assert "one seed: no comparison is possible beyond the point estimate" in part
    assert "Δ = +0.300" in part                                                        # drop-c − sft, 0.90 − 0.60
    assert "With one seed per variant no comparison with the controls is possible beyond point estimates." in part
    assert "RL not shown to help here.** (One seed: point estimates only" in text.splitlines()[2]
    assert "0.300 (n=1, no CI)" in rep.variants_table(report)


def test_missing_control_runs_make_no_claim(tmp_path):
    # the SFT control is in the manifest but never ran: a column of dashes, no RL claim
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS, controls=CONTROLS)
    import shutil
    for seed in (0, 1, 2):
        shutil.rmtree(sweep / f"control-sft-s{seed}")
    report = rep.build_report(sweep)
    assert all(c["outcome"] == "no comparison" for c in report.against_controls if c["role"] == "sft")
    text = rep.render_markdown(report)
    assert "Δ vs SFT control" in text and "RL not shown" not in text and "No variant beats" not in text
    assert "no comparison with the SFT control (the control has no completed run)" in text
    # a metric the control does not log (an SFT run samples no reward) is said, not guessed
    rows = {r["variant"]: r for r in rep.build_report(make_sweep(tmp_path / "r", LOO, controls=CONTROLS),
                                                       metric="reward/mean").rows}
    assert rows["all"]["delta_vs_sft"].mean is None and rows["all"]["delta_vs_base"].mean is not None


def test_sweep_without_controls_has_no_control_columns(tmp_path):
    out = tmp_path / "out"
    report = rep.build_report(make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS))
    rep.write_report(report, out, figures=False)
    md = (out / "report.md").read_text()
    for absent in ("Δ vs base", "Δ vs SFT", "Against the controls", "RL not shown", "Controls:"):
        assert absent not in md
    assert not [c for c in pd.read_csv(out / "report.csv").columns if "vs_" in c or "beats" in c]
    data = json.loads((out / "report.json").read_text())
    assert "controls" not in data and "against_controls" not in data
    assert not any("delta_vs_base" in v for v in data["variants"])


def test_controls_recognised_without_manifest(tmp_path):
    # add-one-in: the base and control-base both have no tricks; the control must not pose as
    # the base in the contrast of x (dirs are read in name order: control-base comes after base)
    variants = {"base": {"tricks": [], "reference": None, "final": {0: 0.60, 1: 0.64, 2: 0.62}},
                "+x": {"tricks": ["x"], "reference": "base", "final": {0: 0.75, 1: 0.80, 2: 0.78}}}
    sweep = make_sweep(tmp_path / "s", variants, mode="add-one-in", manifest=False, controls=CONTROLS)
    report = rep.build_report(sweep)
    rows = {r["variant"]: r for r in report.rows}
    assert [r["variant"] for r in report.rows] == ["+x", "base", "control-base", "control-sft"]
    assert report.controls == {"base": "control-base", "sft": "control-sft"}
    assert [(v["trick"], v["with"], v["without"]) for v in report.verdicts] == [("x", "+x", "base")]
    assert rows["+x"]["reference"] == "base" and rows["control-base"]["reference"] is None
    assert rows["+x"]["delta_vs_base"].mean == pytest.approx(np.mean([0.75, 0.80, 0.78]) - 0.5)

    # by name alone (config.yaml without a control node, as an older trainer writes it)
    for config in sweep.glob("*/config.yaml"):
        data = yaml.safe_load(config.read_text())
        data.pop("control", None)
        config.write_text(yaml.safe_dump(data))
    report = rep.build_report(sweep)
    assert report.controls == {"base": "control-base", "sft": "control-sft"}
    assert [(v["trick"], v["with"], v["without"]) for v in report.verdicts] == [("x", "+x", "base")]

    # by config.yaml alone: control.name says sft, whatever the variant is called
    for config in sweep.glob("control-sft-s*/config.yaml"):
        data = yaml.safe_load(config.read_text())
        data["control"] = {"name": "sft", "budget": "wall"}
        data["sweep"]["variant"] = "supervised"
        config.write_text(yaml.safe_dump(data))
    report = rep.build_report(sweep)
    assert report.controls == {"base": "control-base", "sft": "supervised"}
    assert {r["variant"]: r for r in report.rows}["supervised"]["budget"] == "wall"


def test_malformed_controls_in_manifest_are_notes(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS, controls={"base": CONTROLS["base"]})
    manifest = json.loads((sweep / "manifest.json").read_text())
    manifest["controls"] = {"base": "control-base", "sft": "control-nope"}
    manifest["contrasts"].append({"trick": "q", "with": "all", "without": "control-base"})
    (sweep / "manifest.json").write_text(json.dumps(manifest))
    report = rep.build_report(sweep)
    text = rep.render_markdown(report)
    assert "names 'control-nope' as the sft control, but the sweep has no such variant" in text
    assert "contrasts with a control left out of the trick verdicts: q (all vs control-base)" in text
    assert "Δ vs base" in text and "Δ vs SFT control" not in text
    manifest["controls"] = ["control-base"]
    (sweep / "manifest.json").write_text(json.dumps(manifest))
    report = rep.build_report(sweep)   # still a control by its kind
    assert report.controls == {"base": "control-base"}
    assert "`controls` is not an object" in rep.render_markdown(report)


def test_controls_drawn_as_reference_lines(tmp_path, monkeypatch):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    legends = {}
    save = Figure.savefig

    def recording_savefig(fig, path, *args, **kwargs):   # what each PNG's legend says
        legend = fig.axes[0].get_legend()
        legends[os.path.basename(str(path))] = [t.get_text() for t in legend.get_texts()] if legend else []
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording_savefig)
    report = rep.build_report(make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS, controls=CONTROLS))
    out = tmp_path / "out"
    rep.write_report(report, out)
    assert legends["curve_eval_accuracy.png"][-2:] == ["control: base (n=3)", "control: sft (n=3)"]
    # the base samples every step (reward, length); the SFT control has no RL curves
    assert "control: base (n=3)" in legends["curve_reward_mean.png"]
    assert "control: base (n=3)" in legends["curve_length_mean.png"]
    assert not [t for t in legends["curve_reward_mean.png"] if "sft" in t]
    assert not [t for t in legends["curve_policy_entropy.png"] if "control" in t]
    assert not [t for t in legends["delta.png"] if "control" in t]
    import matplotlib.image
    for png in sorted(out.glob("*.png")):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = matplotlib.image.imread(png)
        assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0
    # csv and json carry the new columns with the same numbers
    csv = pd.read_csv(out / "report.csv").set_index("variant")
    for column in ("delta_vs_base", "delta_vs_base_ci_low", "delta_vs_base_ci_high", "delta_vs_base_n",
                   "beats_base", "delta_vs_sft", "delta_vs_sft_ci_low", "delta_vs_sft_ci_high", "beats_sft"):
        assert column in csv.columns
    assert csv.loc["all", "delta_vs_sft"] == pytest.approx(-0.01)
    assert csv.loc["all", "delta_vs_sft_ci_high"] == pytest.approx(-0.01 + 4.302653 * 0.02 / math.sqrt(3), abs=1e-6)
    assert csv.loc["drop-c", "beats_sft"] and not csv.loc["drop-a", "beats_sft"]
    assert csv.loc["control-base", "kind"] == "control" and pd.isna(csv.loc["control-base", "delta_vs_base"])
    data = json.loads((out / "report.json").read_text())
    assert data["controls"] == {"base": "control-base", "sft": "control-sft"}
    variant = {v["variant"]: v for v in data["variants"]}["drop-a"]
    assert variant["delta_vs_sft"]["mean"] == pytest.approx(np.mean([-0.13, -0.10, -0.10]))
    assert {(c["variant"], c["role"]): c["outcome"] for c in data["against_controls"]}["drop-a", "sft"] == "not shown"


# --------------------------------------------------------------------------- health flags
def frame(**curves):
    return metrics_frame(metric_rows(**curves))


def names(flags):
    return [(f.name, f.step) for f in flags]


HEALTHY_SAMPLES = [{"step": s, "prompt": f"{a}+{s}=", "completion": f"{a}+{s % 10}={a + s % 10};{a + s}",
                    "reward": 1.0, "truncated": False} for s in (10, 20, 30, 40) for a in (1, 2, 3, 4)]


def test_healthy_run_raises_no_flag():
    th = HealthThresholds()
    # entropy halves, KL rises a little, lengths grow a little: all normal
    df = frame(policy__entropy=lambda s: 0.8 - 0.01 * s, kl__k3=lambda s: 0.002 * s,
               length__mean=lambda s: 12 + s / 10, length__truncated_frac=lambda s: 0.05)
    assert health_flags(df, HEALTHY_SAMPLES, MAX_NEW, th) == []
    assert health_flags(df, [], None, th) == []          # no samples, no cap known
    assert health_flags(metrics_frame([]), [], MAX_NEW, th) == []


def test_diverged_flag():
    df = metrics_frame(metric_rows(diverge_at=12))
    assert names(health_flags(df, [], MAX_NEW)) == [("diverged", 12)]
    status = {"state": "diverged", "step": 9, "reason": "non-finite logits at step 9"}
    flags = health_flags(frame(), [], MAX_NEW, status=status)
    assert flags == [Flag("diverged", 9, "non-finite logits at step 9")]


def test_entropy_collapse_flag():
    collapse = lambda s: 0.8 if s < 20 else 0.05                 # below 0.1 x 0.8 from step 20 on
    assert names(health_flags(frame(policy__entropy=collapse), [], MAX_NEW)) == [("entropy_collapse", 20)]
    blip = lambda s: 0.05 if s in (20, 21) else 0.8              # two low steps < patience 3
    assert health_flags(frame(policy__entropy=blip), [], MAX_NEW) == []
    loose = HealthThresholds(entropy_collapse_frac=0.01)
    assert health_flags(frame(policy__entropy=collapse), [], MAX_NEW, loose) == []


def test_length_blowup_flag():
    to_cap = lambda s: 12.0 if s < 15 else 31.0                   # 31 >= 0.95 x 32
    assert names(health_flags(frame(length__mean=to_cap), [], MAX_NEW)) == [("length_blowup", 15)]
    assert health_flags(frame(length__mean=to_cap), [], None) == []   # no cap known, no truncation
    truncating = lambda s: 0.6 if s >= 25 else 0.1
    flags = health_flags(frame(length__truncated_frac=truncating), [], MAX_NEW)
    assert names(flags) == [("length_blowup", 25)] and "truncated_frac 0.60" in flags[0].detail


def test_repetition_flag():
    repeater = [dict(r, completion="1+1=2," * 8) if r["step"] >= 30 else r for r in HEALTHY_SAMPLES]
    flags = health_flags(frame(), repeater, MAX_NEW)
    assert names(flags) == [("repetition", 30)] and "distinct-2" in flags[0].detail
    same = [dict(r, completion="5+5=10;10") if r["step"] >= 20 else r for r in HEALTHY_SAMPLES]
    flags = health_flags(frame(), same, MAX_NEW)
    assert names(flags) == [("repetition", 20)] and "4 of 4 different prompts" in flags[0].detail
    # one prompt answered the same way four times is a converged policy, not a repeater
    one_prompt = [dict(r, prompt="2+2=", completion="2+2=4;4") for r in HEALTHY_SAMPLES]
    assert health_flags(frame(), one_prompt, MAX_NEW) == []


def test_kl_drift_flag():
    drift = lambda s: 0.01 * s                                     # > 0.1 from step 11 to the end
    flags = health_flags(frame(kl__k3=drift), [], MAX_NEW)
    assert names(flags) == [("kl_drift", 11)] and "kl/k3" in flags[0].detail
    back = lambda s: 0.3 if 10 <= s < 30 else 0.02                 # rises, then comes back
    assert health_flags(frame(kl__k3=back), [], MAX_NEW) == []
    settling = lambda s: 0.5 - 0.005 * s                           # above, but falling: 0.5 -> 0.3
    assert health_flags(frame(kl__k3=settling), [], MAX_NEW) == []
    no_k3 = metrics_frame([{k: v for k, v in r.items() if k != "kl/k3"} | {"kl/k1": drift(r["step"])}
                           for r in metric_rows()])
    assert names(health_flags(no_k3, [], MAX_NEW)) == [("kl_drift", 11)]


def test_flags_reach_the_report(tmp_path):
    variants = dict(LOO, **{"drop-c": dict(LOO["drop-c"], curves={"policy__entropy": lambda s: 0.8 if s < 20 else 0.01})})
    report = rep.build_report(make_sweep(tmp_path / "s", variants, contrasts=LOO_CONTRASTS))
    text = rep.render_markdown(report)
    assert "| drop-c-s0 | entropy_collapse | 20 |" in text
    # c's runs collapse without it, so c is not what breaks training; the numbers decide
    assert {v["trick"]: v["verdict"] for v in report.verdicts}["c"] == "hurts"
    assert "entropy_collapse×3" in text


# --------------------------------------------------------------------------- damaged sweep dirs
def test_partial_sweep_says_what_is_missing(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    (sweep / "all-s2" / "metrics.jsonl").unlink()                             # no metrics
    with open(sweep / "drop-a-s0" / "metrics.jsonl", "a") as f:               # killed mid-write
        f.write('{"step": 41, "loss": 0.')
    (sweep / "drop-b-s1" / "status.json").unlink()                            # no status
    import shutil
    shutil.rmtree(sweep / "drop-c-s2")                                        # never started
    report = rep.build_report(sweep)
    text = rep.render_markdown(report)
    assert "`all-s2`: no metrics.jsonl; status.json says completed, but there are no metrics" in text
    assert "`drop-a-s0`: metrics.jsonl: torn last line ignored" in text
    assert "`drop-b-s1`: no status.json" in text
    assert "`drop-c-s2`: not started (no run dir)" in text
    rows = {r["variant"]: r for r in report.rows}
    assert rows["all"]["final"].n == 2 and rows["all"]["status"]["missing"] == 1
    assert rows["drop-a"]["final"].mean == pytest.approx(np.mean([0.70, 0.75, 0.71]))   # torn line ignored
    assert "2 completed, 1 missing" in text
    # seeds no longer match: Welch instead of pairing
    assert "Welch" in {v["trick"]: v for v in report.verdicts}["a"]["delta"].basis
    assert not report.finished


def test_missing_manifest_groups_run_dirs(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, manifest=False)
    report = rep.build_report(sweep)
    assert not report.sweep.manifest_found
    assert {r["variant"] for r in report.rows} == set(LOO)
    rows = {r["variant"]: r for r in report.rows}
    assert rows["drop-a"]["reference"] == "all"                 # leave-one-out: one trick more
    assert {v["trick"]: v["verdict"] for v in report.verdicts} == {"a": "helps", "b": "no evidence", "c": "hurts"}
    assert "manifest.json is missing" in rep.render_markdown(report)
    # plain train runs carry no sweep node: the variant named `all` still says leave-one-out
    for config in sweep.glob("*/config.yaml"):
        data = yaml.safe_load(config.read_text())
        del data["sweep"]
        config.write_text(yaml.safe_dump(data))
    rows = {r["variant"]: r for r in rep.build_report(sweep).rows}
    assert rows["drop-b"]["reference"] == "all" and rows["all"]["reference"] is None


def test_cli_missing_dir_and_bad_input(tmp_path):
    result = cli("report", str(tmp_path / "nope"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"error: {tmp_path / 'nope'}: no such directory"
    (tmp_path / "empty").mkdir()
    make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    for args, message in [(["report", str(tmp_path / "empty")], "no manifest.json and no run dirs"),
                          (["report", str(tmp_path / "s"), "--metric", "eval/nope"], "metric 'eval/nope'"),
                          (["report", str(tmp_path / "s"), "--threshold", "patience=x"], "not an integer"),
                          (["report", str(tmp_path / "s"), "--threshold", "bogus=1"], "entropy_collapse_frac"),
                          (["report", str(tmp_path / "s"), "--format", "html"], "--format 'html'")]:
        result = cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


# --------------------------------------------------------------------------- files and formats
def test_cli_writes_md_csv_json_and_pngs(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    (sweep / "drop-b-s1" / "metrics.jsonl").write_text("")                    # an empty run dir too
    out = tmp_path / "out"
    result = cli("report", str(sweep), "--metric", "eval_accuracy", "--out", str(out), "--format", "csv")
    assert result.returncode == 0, result.stderr
    printed = pd.read_csv(io.StringIO(result.stdout))
    assert list(printed["variant"]) == list(LOO) and printed.loc[0, "final_mean"] == pytest.approx(0.82)
    written = pd.read_csv(out / "report.csv")
    assert written.loc[0, "final_ci_high"] == pytest.approx(0.82 + 4.302653 * 0.02 / math.sqrt(3), abs=1e-5)
    data = json.loads((out / "report.json").read_text())
    assert data["metric"] == "eval/accuracy"
    assert {v["trick"]: v["verdict"] for v in data["verdicts"]}["a"] == "helps"
    md = (out / "report.md").read_text()
    assert "## Variants" in md and "`drop-b-s1`: metrics.jsonl is empty" in md
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["curve_eval_accuracy.png", "curve_kl.png", "curve_length_mean.png",
                    "curve_policy_entropy.png", "curve_reward_mean.png", "delta.png"]
    import matplotlib.image
    for name in pngs:
        assert f"]({name})" in md
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = matplotlib.image.imread(out / name)
        assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0
    assert not (sweep / "report.md").exists()
    result = cli("report", str(sweep), "--format", "json")                     # default out dir
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["sweep"]["wandb_group"] == "loo-2026-11-30_05-40-00"
    assert (sweep / "report.md").exists() and (sweep / "delta.png").exists()


def test_report_imports_neither_torch_nor_transformers():
    code = "import sys, grpo_ablate.report; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.split() == ["False", "False"], out.stderr


# --------------------------------------------------------------------------- W&B
def test_wandb_report_fails_fast_offline(tmp_path):
    make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    result = cli("report", str(tmp_path / "s"), "--wandb-report", env={"WANDB_MODE": "offline"})
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --wandb-report builds a W&B Report online, but WANDB_MODE=offline"
    result = cli("report", str(tmp_path / "s"), "--wandb-report", env={"WANDB_MODE": None, "WANDB_API_KEY": None,
                                                                         "HOME": str(tmp_path)})
    assert result.returncode == 2 and "needs a W&B login" in result.stderr
    assert not (tmp_path / "s" / "report.md").exists()          # refused before anything was written


def test_wandb_summary_run_offline(tmp_path):
    make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    result = cli("report", str(tmp_path / "s"), "--out", str(tmp_path / "out"), "--wandb",
                 env={"WANDB_MODE": None, "WANDB_API_KEY": None, "HOME": str(tmp_path)}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "W&B offline run" in result.stderr and "group loo-2026-11-30_05-40-00, job_type report" in result.stderr
    runs = list((tmp_path / "out" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].rglob("*.wandb"))


# --------------------------------------------------------------------------- watch
def test_watch_ends_when_every_run_has_finished(tmp_path):
    make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    result = cli("report", str(tmp_path / "s"), "--watch")          # no SECONDS: the default, 30
    assert result.returncode == 0, result.stderr
    assert "12/12 runs finished" in result.stdout and (tmp_path / "s" / "delta.png").exists()


def test_watch_follows_a_running_sweep_and_stops_on_ctrl_c(tmp_path):
    sweep = make_sweep(tmp_path / "s", {"all": LOO["all"]}, seeds=(0, 1))
    status = sweep / "all-s1" / "status.json"
    status.write_text(json.dumps(dict(json.loads(status.read_text()), state="running")))
    env = {k: v for k, v in os.environ.items()}
    args = [sys.executable, "-m", "grpo_ablate.cli", "report", str(sweep), "--watch", "0.2"]

    def first_refresh(proc):
        return proc.stdout.readline()    # blocks until the first table is out

    # the last run finishes while it watches: it stops by itself, exit 0, figures drawn
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert "1/2 runs finished" in first_refresh(proc)
    status.write_text(json.dumps(dict(json.loads(status.read_text()), state="completed")))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "2/2 runs finished" in out and (sweep / "curve_eval_accuracy.png").exists()

    # Ctrl-C: exit 0, one line, no traceback; the text files hold the last refresh
    status.write_text(json.dumps(dict(json.loads(status.read_text()), state="running")))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert "1/2 runs finished" in first_refresh(proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err and "stopped watching" in err, err
    assert "1 running@40" in (sweep / "report.md").read_text()
