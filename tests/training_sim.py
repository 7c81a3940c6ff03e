"""Synthetic add-one-in sweeps across contexts with a per-context base control, written as the
sweep command and the trainer write them, for the training-vs-start check (report/training.py)
through the real report path.

Each context c has its warm start: problem j is answered correctly at the start with
probability q0_j = sigmoid(θ_j), drawn once (greedy decoding of fixed weights: the same answers
every time the start is evaluated, so the base control's runs all log one set of scores, and
every run's eval at step 0 is that same set). A run (variant v, seed s) after training answers
problem j with probability sigmoid(θ_j + u_s + w_vs + τ_c + δ_v): u_s the seed's luck, w_vs
the run's own noise, τ_c what training does in context c (0: nothing on average), δ_v the
trick's effect (0 under the null). Its evals at steps 10, 20, 30 are fresh draws.
"""
import json

import numpy as np

from report_sim import EVAL_EVERY, STEPS, logistic, write_run


def simulate_contexts(rng, training=None, effects=None, tricks=2, seeds=5, problems=200, seed_sd=0.25, run_sd=0.25,
                      difficulty_sd=1.5, base_logit=0.5):
    """(plan, scores): plan variant -> (context, tricks on, reference, kind); scores variant ->
    {seed: {eval step: per-problem 0/1}} (module docstring). `training`: context -> τ_c (logit
    scale), `effects`: trick -> δ."""
    training = training if training is not None else {"a": 0.0, "b": 0.0}
    effects = effects or {}
    names = [f"t{i}" for i in range(tricks)]
    plan, scores = {}, {}
    for ctx, tau in training.items():
        theta = base_logit + difficulty_sd * rng.standard_normal(problems)
        start = (rng.random(problems) < logistic(theta)).astype(float)      # the warm start's eval: one draw
        u = seed_sd * rng.standard_normal(seeds)
        plan[f"base@{ctx}"] = (ctx, [], None, "treatment")
        plan.update({f"add-{t}@{ctx}": (ctx, [t], f"base@{ctx}", "treatment") for t in names})
        for v in [f"base@{ctx}", *(f"add-{t}@{ctx}" for t in names)]:
            delta = effects.get(v.split("@")[0][len("add-"):], 0.0)
            for s in range(seeds):
                q = logistic(theta + u[s] + run_sd * rng.standard_normal() + tau + delta)
                scores.setdefault(v, {})[s] = {0: start, **{step: (rng.random(problems) < q).astype(float)
                                                            for step in range(EVAL_EVERY, STEPS + 1, EVAL_EVERY)}}
        plan[f"control-base@{ctx}"] = (ctx, [], None, "control")
        scores[f"control-base@{ctx}"] = {s: {step: start for step in range(0, STEPS + 1, EVAL_EVERY)}
                                        for s in range(seeds)}
    return plan, scores


def fast_checks(plan, scores, method="holm", alpha=0.05, k=3):
    """(training verdicts by context, trick verdicts by contrast) on simulated scores through the
    report's own functions (Evidence, settle_family), as build_report decides them on the same
    numbers (tests/test_training_check.py checks that they agree): the trick contrasts one family,
    the training checks another."""
    from grpo_ablate.report.evidence import Evidence
    from grpo_ablate.report.verdicts import settle_family

    of = lambda e: np.mean([e[step] for step in sorted(e)[-k:]], axis=0)
    problems = len(next(iter(next(iter(scores.values())).values()))[STEPS])
    values = {v: {s: float(of(e).mean()) for s, e in by_seed.items()} for v, by_seed in scores.items()}
    evidence = Evidence(values, 1.0 / (problems * k), {v: {s: of(e) for s, e in by_seed.items()}
                                                       for v, by_seed in scores.items()}, method, alpha)
    evidence.model([(v, ref) for v, (_, _, ref, _) in plan.items() if ref is not None])   # the trick stars
    item = lambda name, a, b: {"trick": name, "with": a, "without": b, "verdict": None, "broke": None,
                               "delta": evidence.delta(a, b)}
    tricks = [item(v.split("@")[0][len("add-"):] + "@" + ctx, v, ref)
              for v, (ctx, _, ref, kind) in plan.items() if ref is not None]
    contexts = sorted({ctx for ctx, *_ in plan.values()})
    training = [item(ctx, f"base@{ctx}", f"control-base@{ctx}") for ctx in contexts]
    settle_family(tricks, evidence, True, None)
    settle_family(training, evidence, True, None)
    return {t["trick"]: t for t in training}, {t["trick"]: t for t in tricks}


def write_context_sweep(path, rng, control=True, **options):
    """A sweep dir of `simulate_contexts(rng, **options)` (without the base control's runs when not
    `control`); returns (path, plan, scores)."""
    plan, scores = simulate_contexts(rng, **options)
    path.mkdir(parents=True)
    variants, runs, contrasts = [], [], []
    for v, (ctx, on, ref, kind) in plan.items():
        if kind == "control" and not control:
            continue
        variants.append({"name": v, "tricks_on": on, "reference": ref, "kind": kind, "context": ctx,
                         "overrides": ["control=base", "control.sample=false"] if kind == "control" else []})
        for s, evals in scores[v].items():
            runs.append(_entry(v, s))
            write_run(path / f"{v}-s{s}", v, s, on, evals, "completed", len(evals[STEPS]))
        if ref is not None:
            trick = on[0]
            contrasts.append({"trick": f"{trick}@{ctx}", "with": v, "without": ref, "context": ctx, "tests": trick})
    contexts = list(dict.fromkeys(ctx for ctx, *_ in plan.values()))
    manifest = {"version": 1, "sweep_id": "sim", "name": "sim", "mode": "add-one-in", "base": None,
                "tricks": sorted({t for _, on, _, _ in plan.values() for t in on}),
                "seeds": sorted(next(iter(scores.values()))), "overrides": [], "launcher": "joblib",
                "wandb_group": "sim", "created_at": "x", "updated_at": "x",
                "contexts": [{"name": c, "overrides": []} for c in contexts],
                "variants": variants, "contrasts": contrasts, "runs": runs,
                "controls": {"base": "control-base"} if control else {},
                "decides_on": {"metric": "eval/accuracy", "summary": "last_3"}, "checks_training": True}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path, plan, scores


def _entry(variant, seed):
    return {"variant": variant, "seed": seed, "run_dir": f"{variant}-s{seed}", "config_hash": "x",
            "status": "completed", "step": STEPS, "reason": None, "final_accuracy": None, "overrides": []}
