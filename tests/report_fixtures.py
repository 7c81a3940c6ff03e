"""Synthetic sweep dirs with known numbers, for the report's tests.

The builder writes exactly what the trainer and the sweep command write (the run-dir
contract and manifest version 1), with eval accuracy rising linearly from 0.5 to a chosen
final value, so every final value, AUC, CI and Δ can be computed by hand.
"""
import json
import math

import numpy as np
import yaml

T_975 = {2: 4.302653, 3: 3.182446}   # Student-t 0.975 quantiles from tables
STEPS, MAX_NEW = 40, 32
SWEEP_ID = "2026-11-30_05-40-00"   # the manifest's, and every run's config.yaml (sweep.id)


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
               "sweep": {"name": "loo", "id": SWEEP_ID, "mode": mode, "variant": variant, "tricks": []}}
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
            "version": 1, "sweep_id": SWEEP_ID, "name": "loo", "mode": mode, "base": "grpo",
            "tricks": sorted({t for v in variants.values() for t in v["tricks"]}), "seeds": list(seeds),
            "overrides": ["steps=40"], "launcher": "joblib", "wandb_group": "loo-2026-11-30_05-40-00",
            "created_at": "x", "updated_at": "x",
            "variants": [{"name": n, "tricks_on": v["tricks"], "overrides": v.get("overrides", []),
                          "reference": v.get("reference"),
                          "kind": v.get("kind", "treatment"),
                          **({"expect": v["expect"]} if v.get("expect") else {})} for n, v in variants.items()],
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


# The LOO sweep above with both controls: the untrained base evaluates flat at 0.5 on every
# seed (greedy eval of a fixed policy); the SFT control ends near `all`.
SFT = {0: 0.83, 1: 0.85, 2: 0.81}
CONTROLS = {"base": {"final": {0: 0.5, 1: 0.5, 2: 0.5}}, "sft": {"final": SFT}}
