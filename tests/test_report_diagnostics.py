"""The report's diagnostics sections on synthetic sweep dirs with known numbers: pairwise
interactions (Δ_ab − Δ_a − Δ_b, paired and Welch), gradient conflicts per variant, and the
conflict check of a `sweep conflict`."""
import json
import math

import numpy as np
import pytest

from conftest import cli
from grpo_ablate.report.build import build_report
from grpo_ablate.report.render import render_markdown
from grpo_ablate.stats.student import t_quantile
from report_fixtures import LOO, LOO_CONTRASTS, T_975, hand_ci, make_sweep

# finals per seed: a helps (+0.10), b helps (+0.05), c barely; a and b together gain 0.08 more
# than their effects add up to (synergy), a and c lose 0.09 (conflict), b and c just add up
BASE = {0: 0.50, 1: 0.52, 2: 0.51}
EFFECT = {"a": 0.10, "b": 0.05, "c": 0.02}
EXTRA = {("a", "b"): {0: 0.08, 1: 0.07, 2: 0.09}, ("a", "c"): {0: -0.09, 1: -0.12, 2: -0.08},
         ("b", "c"): {0: 0.01, 1: -0.02, 2: 0.00}}
NOISE = {"a": {0: 0.01, 1: -0.01, 2: 0.0}, "b": {0: 0.0, 1: 0.01, 2: -0.01}, "c": {0: -0.01, 1: 0.0, 2: 0.01}}


def pairwise_variants():
    variants = {"base": {"tricks": [], "reference": None, "final": dict(BASE)}}
    for t in "abc":
        variants[t] = {"tricks": [t], "reference": "base",
                       "final": {s: BASE[s] + EFFECT[t] + NOISE[t][s] for s in BASE}}
    for (x, y), extra in EXTRA.items():
        variants[f"{x}+{y}"] = {"tricks": [x, y], "reference": "base",
                                "final": {s: BASE[s] + EFFECT[x] + EFFECT[y] + extra[s] for s in BASE}}
    return variants


CONTRASTS = [{"trick": t, "with": t, "without": "base"} for t in "abc"]


def test_interactions_paired_by_seed(tmp_path):
    variants = pairwise_variants()
    report = build_report(make_sweep(tmp_path / "s", variants, contrasts=CONTRASTS, mode="pairwise"))
    pairs = {(p["a"], p["b"]): p for p in report.diagnostics["interactions"]}
    assert list(pairs) == [("a", "b"), ("a", "c"), ("b", "c")]
    for (x, y), p in pairs.items():
        f = {n: variants[n]["final"] for n in ("base", x, y, f"{x}+{y}")}
        per_seed = [f[f"{x}+{y}"][s] - f[x][s] - f[y][s] + f["base"][s] for s in BASE]
        # by construction I_s = EXTRA - NOISE_x - NOISE_y
        assert per_seed == pytest.approx([EXTRA[(x, y)][s] - NOISE[x][s] - NOISE[y][s] for s in BASE], abs=1e-12)
        est = p["interaction"]
        assert (est.mean, est.low, est.high) == pytest.approx(hand_ci(per_seed, T_975[2]), abs=1e-6)
        assert "paired" in est.basis
        d_a = [f[x][s] - f["base"][s] for s in BASE]
        assert p["delta_a"].mean == pytest.approx(np.mean(d_a), abs=1e-12)
    assert pairs[("a", "b")]["reading"] == "synergy"
    assert pairs[("a", "c")]["reading"] == "conflict"
    assert pairs[("b", "c")]["reading"].startswith("no evidence")
    # a cost metric reads the same numbers the other way round
    flipped = build_report(tmp_path / "s", higher_is_better=False).diagnostics["interactions"]
    assert [p["reading"] for p in flipped][:2] == ["conflict", "synergy"]
    text = render_markdown(report)
    assert "## Interactions" in text and "| a | b |" in text and "synergy" in text
    ab = pairs[("a", "b")]["interaction"]
    assert f"{ab.mean:+.3f} [{ab.low:+.3f}, {ab.high:+.3f}]" in text


def test_interactions_welch_when_seeds_differ(tmp_path):
    variants = pairwise_variants()
    del variants["a+b"]["final"][2]              # the pair has seeds 0, 1 only
    report = build_report(make_sweep(tmp_path / "s", variants, contrasts=CONTRASTS, mode="pairwise"))
    est = {(p["a"], p["b"]): p for p in report.diagnostics["interactions"]}[("a", "b")]["interaction"]
    sides = [list(variants[n]["final"].values()) for n in ("a+b", "a", "b", "base")]
    mean = np.mean(sides[0]) - np.mean(sides[1]) - np.mean(sides[2]) + np.mean(sides[3])
    parts = [np.var(x, ddof=1) / len(x) for x in sides]
    df = sum(parts) ** 2 / sum(p ** 2 / (len(x) - 1) for p, x in zip(parts, sides))
    half = t_quantile(0.975, df) * math.sqrt(sum(parts))
    assert "Welch" in est.basis
    assert (est.mean, est.low, est.high) == pytest.approx((mean, mean - half, mean + half), abs=1e-9)


@pytest.mark.full
def test_interaction_heatmap_and_json(tmp_path):
    sweep = make_sweep(tmp_path / "s", pairwise_variants(), contrasts=CONTRASTS, mode="pairwise")
    result = cli("report", str(sweep), "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads((sweep / "report.json").read_text())
    pairs = data["diagnostics"]["interactions"]
    assert [(p["a"], p["b"], p["reading"]) for p in pairs][0] == ("a", "b", "synergy")
    assert pairs[0]["interaction"]["low"] > 0
    png = sweep / "interactions.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    import matplotlib.image
    assert matplotlib.image.imread(png).std() > 0
    assert "](interactions.png)" in (sweep / "report.md").read_text()


def add_columns(run_dir, columns):
    """Add per-step values (column -> function of the step) to a run's metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        if row["step"] >= 1:
            row.update({c: f(row["step"]) for c, f in columns.items() if f(row["step"]) is not None})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_gradient_conflicts_per_variant(tmp_path):
    variants = {"base": {"tricks": [], "reference": None, "final": {0: 0.5, 1: 0.5}},
                "long": {"tricks": ["x"], "reference": "base", "final": {0: 0.6, 1: 0.6}}}
    sweep = make_sweep(tmp_path / "s", variants, seeds=(0, 1), mode="add-one-in",
                       contrasts=[{"trick": "x", "with": "long", "without": "base"}])
    every5 = lambda value: (lambda s: value(s) if s % 5 == 0 else None)   # logged every 5 steps
    for seed in (0, 1):
        add_columns(sweep / f"base-s{seed}", {"grad_norm/policy": every5(lambda s: 1.0),
                                             "grad_cos/policy__kl": every5(lambda s: 0.3)})
        add_columns(sweep / f"long-s{seed}", {
            "grad_norm/task_reward": every5(lambda s: 1.0), "grad_norm/length_reward": every5(lambda s: 1.0),
            # below -0.1 at 5 of 8 logged steps per run: a conflict
            "grad_cos/task_reward__length_reward": every5(lambda s: -0.6 if s <= 25 else 0.2),
            # below -0.1 at only 3 of 8: not one
            "grad_cos/policy__kl": every5(lambda s: -0.5 if s <= 15 else 0.1)})
    report = build_report(sweep)
    section = {v["variant"]: v for v in report.diagnostics["gradient_conflicts"]["variants"]}
    pairs = {(p["a"], p["b"]): p for p in section["long"]["pairs"]}
    assert pairs[("task_reward", "length_reward")] == {"a": "task_reward", "b": "length_reward", "steps": 16,
                                                       "median": -0.6, "below": 10, "conflict": True}
    assert pairs[("policy", "kl")]["below"] == 6 and not pairs[("policy", "kl")]["conflict"]
    assert not any(p["conflict"] for p in section["base"]["pairs"])
    text = render_markdown(report)
    assert "## Gradient conflicts" in text
    assert "- **long**: conflicting: task_reward × length_reward (median cos -0.60, 10/16 steps below -0.1)" in text
    assert "- **base**: no conflicting pair among the 1 logged." in text
    # a stricter threshold: nothing conflicts
    strict = build_report(sweep, conflict_threshold=-0.7).diagnostics["gradient_conflicts"]
    assert not any(p["conflict"] for v in strict["variants"] for p in v["pairs"])
    bad = cli("report", str(sweep), "--conflict-threshold", "-2")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --conflict-threshold -2.0 is not allowed")


def test_no_diagnostics_section_without_gradients_or_pairs(tmp_path):
    report = build_report(make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS))
    assert report.diagnostics == {}
    text = render_markdown(report)
    assert "## Interactions" not in text and "## Gradient conflicts" not in text


def conflict_sweep(tmp_path, trick_final, reward_final, trick_len, reward_len):
    variants = {"base": {"tricks": [], "reference": None, "final": {0: 0.60, 1: 0.62, 2: 0.61}},
                "trick-t": {"tricks": ["t"], "reference": "base", "final": trick_final,
                            "curves": {"length__mean": lambda s: trick_len}},
                "reward-r": {"tricks": ["r"], "reference": "base", "final": reward_final,
                             "curves": {"length__mean": lambda s: reward_len}}}
    sweep = make_sweep(tmp_path, variants, mode="conflict",
                       contrasts=[{"trick": "t", "with": "trick-t", "without": "base"},
                                  {"trick": "r", "with": "reward-r", "without": "base"}])
    for seed in (0, 1, 2):
        add_columns(sweep / f"base-s{seed}", {"grad_norm/policy": lambda s: 1.0})
        add_columns(sweep / f"trick-t-s{seed}", {"grad_norm/policy": lambda s: 1.0, "grad_norm/entropy": lambda s: 0.1,
                                                 "grad_cos/policy__entropy": lambda s: 0.2})
        add_columns(sweep / f"reward-r-s{seed}", {"grad_norm/policy": lambda s: 1.0,
                                                  "grad_norm/task_reward": lambda s: 1.0,
                                                  "grad_norm/length_reward": lambda s: 1.0,
                                                  "grad_cos/task_reward__length_reward": lambda s: -0.8})
    return build_report(sweep)


def test_conflict_check_says_whether_directions_agree(tmp_path):
    # both raise accuracy and both shorten the completions (base length 12): they agree
    report = conflict_sweep(tmp_path / "agree", {0: 0.70, 1: 0.73, 2: 0.71}, {0: 0.66, 1: 0.69, 2: 0.68},
                            trick_len=10.0, reward_len=9.0)
    check = report.diagnostics["conflict_check"]
    rows = {r["metric"]: r for r in check["rows"]}
    assert rows["eval/accuracy"]["direction_trick"] == "+" and rows["eval/accuracy"]["direction_reward"] == "+"
    assert rows["length/mean"]["delta_trick"].mean == pytest.approx(-2.0)
    assert rows["length/mean"]["agreement"].startswith("agree")
    assert check["overall"] == "agree"
    grads = {g["role"]: g for g in check["gradients"]}
    assert grads["reward term"]["term"] == "length_reward" and grads["reward term"]["against"] == "task_reward"
    assert grads["reward term"]["median"] == pytest.approx(-0.8) and grads["reward term"]["conflict"]
    assert grads["trick"]["term"] == "entropy" and not grads["trick"]["conflict"]
    text = render_markdown(report)
    assert "## Conflict check: t vs r" in text and "**Directions: agree**" in text
    assert "cos(length_reward, task_reward) median -0.80" in text and "it pushes against it" in text
    # the trick raises accuracy, the reward term lowers it: they disagree, do not combine
    report = conflict_sweep(tmp_path / "disagree", {0: 0.70, 1: 0.73, 2: 0.71}, {0: 0.50, 1: 0.53, 2: 0.52},
                            trick_len=12.0, reward_len=12.0)
    check = report.diagnostics["conflict_check"]
    assert check["overall"] == "disagree" and "do not combine them yet" in render_markdown(report)
