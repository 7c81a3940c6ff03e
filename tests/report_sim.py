"""Synthetic sweeps whose truth is known, written as the trainer and the sweep command write them
(metrics.jsonl, evals.jsonl, status.json, config.yaml, manifest.json), for simulations of the
report's error rates through its real path (`grpo-ablate report`).

The generative model is the one the report's statistics assume, with the eval set made explicit:
run (variant v, seed s) answers problem j correctly with probability
    q = sigmoid(θ_j + u_s + w_vs + δ_v),  then  q + β_vj · min(q, 1 − q)
θ_j: the problem's difficulty (fixed: every run is scored on the same problems); u_s: the seed's
luck, shared by every variant at that seed (what pairing removes); w_vs: the run's own training
noise; δ_v: the variant's true effect (0 under the null); β_vj = ±`problem_spread` with equal
chance, fixed per variant and problem: a trick that helps some problems and hurts as many others
by as much (zero mean on the probability scale, so no effect on the task's accuracy, while the
200 problems drawn carry a nonzero one: the problem-sampling term).
Its final eval/accuracy is the mean of its P Bernoulli draws, so it lies on the 1/P grid.
"""
import json
import math

import numpy as np
import yaml

from grpo_ablate.design import STREAM_SALT
from grpo_ablate.rundir.files import pack_scores

STEPS = 30
EVAL_EVERY = 10


def logistic(x):
    return 1.0 / (1.0 + np.exp(-x))


def simulate(rng, tricks=6, seeds=5, problems=200, effects=None, seed_sd=0.25, run_sd=0.25, problem_spread=0.0,
             base_logit=1.5, difficulty_sd=1.5, sd_scale=None, noise="normal"):
    """(variants, scores): variants name -> (tricks on, reference, true δ); scores name -> {seed:
    {eval step: per-problem 0/1 scores}} of a leave-one-out sweep (module docstring). `effects`:
    trick -> its true δ on the logit scale (dropping it moves the logit by −δ). `sd_scale`: variant ->
    a factor on its run noise w_vs (unequal variances); `noise`: "normal", or "t3" (Student t with 3 df,
    scaled to the same SD: heavy tails)."""
    names = [f"t{i}" for i in range(tricks)]
    effects = effects or {}
    theta = base_logit + difficulty_sd * rng.standard_normal(problems)
    u = seed_sd * rng.standard_normal(seeds)
    variants = {"all": (names, None, 0.0)}
    for t in names:
        variants[f"drop-{t}"] = ([x for x in names if x != t], "all", -effects.get(t, 0.0))
    scores = {}
    for v, (_, _, delta) in variants.items():
        beta = problem_spread * rng.choice([-1.0, 1.0], problems) if v != "all" else np.zeros(problems)
        for s in range(seeds):
            w = rng.standard_t(3) / math.sqrt(3) if noise == "t3" else rng.standard_normal()
            q = logistic(theta + u[s] + run_sd * (sd_scale or {}).get(v, 1.0) * w + delta)
            p = q + beta * np.minimum(q, 1.0 - q)
            scores.setdefault(v, {})[s] = {step: (rng.random(problems) < p).astype(float)
                                           for step in range(0, STEPS + 1, EVAL_EVERY)}
    return variants, scores


def fast_verdicts(scores, method="holm", alpha=0.05, summary="final", seeds_only=False, test="blocked", power=False):
    """The report's verdicts on simulated scores through its own functions (evidence, settle_family),
    without the run dirs: what `grpo-ablate report` decides on the same numbers (tested to agree);
    `power` True: with the Power section's numbers too (its detectable |Δ| costs most of the time)."""
    from grpo_ablate.report.evidence import Evidence
    from grpo_ablate.report.verdicts import settle_family

    steps = sorted(next(iter(next(iter(scores.values())).values())))
    k = 1 if summary == "final" else int(summary.split("_")[1])      # final or last_<k>
    of = lambda e: np.mean([e[step] for step in steps[-k:]], axis=0)
    problems = len(next(iter(next(iter(scores.values())).values()))[steps[-1]])
    values = {v: {s: float(of(e).mean()) for s, e in by_seed.items()} for v, by_seed in scores.items()}
    evidence = Evidence(values, 1.0 / (problems * k), {} if seeds_only else
                        {v: {s: of(e) for s, e in by_seed.items()} for v, by_seed in scores.items()},
                        method, alpha, test=test)
    evidence.model([("all", v) for v in scores if v != "all"])
    verdicts = [{"trick": v[len("drop-"):], "with": "all", "without": v, "verdict": None, "broke": None,
                 "delta": evidence.delta("all", v)} for v in scores if v != "all"]
    settle_family(verdicts, evidence, True, None, power)
    return {v["trick"]: v for v in verdicts}


def write_sweep(path, rng, drop_run=None, broken=None, mode="leave-one-out", **options):
    """A leave-one-out sweep dir of `simulate(rng, **options)`; returns (path, scores). `drop_run`:
    (variant, seed) left without a run dir; `broken`: {(variant, seed)} that diverged; `mode`: the
    mode the sweep records (aa: an A/A sweep, its drops read as placebos)."""
    path.mkdir(parents=True)
    variants, scores = simulate(rng, **options)
    runs = []
    for v, (on, _, _) in variants.items():
        for s, evals in scores[v].items():
            name = f"{v}-s{s}"
            runs.append({"variant": v, "seed": s, "run_dir": name, "config_hash": "x", "status": "completed",
                         "step": STEPS, "reason": None, "final_accuracy": None, "overrides": []})
            if drop_run == (v, s):
                continue
            state = "diverged" if broken and (v, s) in broken else "completed"
            write_run(path / name, v, s, on, evals, state, len(evals[STEPS]), mode)
    names = variants["all"][0]
    seeds = sorted(scores["all"])
    manifest = {"version": 1, "sweep_id": "sim", "name": "sim", "mode": mode, "base": "grpo",
                "tricks": names, "seeds": seeds, "overrides": [], "launcher": "joblib",
                "wandb_group": "sim", "created_at": "x", "updated_at": "x",
                "variants": [{"name": v, "tricks_on": names if mode == "aa" else on, "reference": ref,
                              "kind": "treatment",
                              # an A/A sweep's placebos: the reference's tricks, each its own sampling stream
                              "overrides": [f"{STREAM_SALT}={i}"] if mode == "aa" and i else []}
                             for i, (v, (on, ref, _)) in enumerate(variants.items())],
                "contrasts": [{"trick": t, "with": "all", "without": f"drop-{t}"} for t in names], "runs": runs}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path, scores


def write_run(run_dir, variant, seed, tricks, evals, state, problems, mode="leave-one-out"):
    run_dir.mkdir()
    last = max(evals) if state == "completed" else STEPS // 2
    rows, eval_rows = [], []
    for step in range(0, last + 1):
        row = {"step": step}
        if step:
            row.update({"loss": 0.1 if state == "completed" or step < last else None, "reward/mean": 0.5,
                        "length/mean": 12.0, "length/truncated_frac": 0.0, "policy/entropy": 0.5,
                        "kl/k3": 0.01, "optim/grad_norm": 0.5, "time/step_s": 0.1})
        if step in evals and (state == "completed" or step < last):
            row["eval/accuracy"] = float(evals[step].mean())
            eval_rows.append({"step": step, "set": "sim", **pack_scores(evals[step])})
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eval_rows))
    (run_dir / "status.json").write_text(json.dumps({
        "state": state, "step": last, "reason": "non-finite loss" if state == "diverged" else None,
        "wall_time_s": 10.0, "config_hash": "x", "wandb_id": None, "updated_at": "x"}))
    (run_dir / "config.yaml").write_text(yaml.safe_dump({
        "seed": seed, "steps": STEPS, "task": {"name": "arithmetic", "eval_size": problems},
        "rollout": {"max_new_tokens": 32}, "tricks": {t: {"family": "x", "option": t} for t in tricks},
        "run": {"name": f"{variant}-s{seed}", "group": "g", "job_type": variant},
        "sweep": {"name": "sim", "id": "sim", "mode": mode, "variant": variant, "tricks": []}}))


# --------------------------------------------------------------------------- sampled evals
def simulate_sampled(rng, tricks=6, seeds=5, problems=200, samples=8, effects=None, seed_sd=0.25, run_sd=0.25,
                     base_logit=1.0, difficulty_sd=1.5, base_shift=None):
    """(variants, bits): a leave-one-out sweep whose evals draw `samples` completions per problem, as
    `eval=sampled` does. bits: variant -> {seed: {eval step: [problems, samples] 0/1}}. The model is
    `simulate`'s, q = sigmoid(θ_j + u_s + w_vs + δ_v), with each sample a draw U < q whose uniform U
    is shared by every variant at the same seed and step (the eval's common random numbers: its draws
    are keyed by (seed, step), evals/score.py). With `base_shift` not None the sweep has a base
    control (`control-base`): the untrained weights, the same at every seed (no u_s, no w_vs),
    q = sigmoid(θ_j + base_shift), sampled with the same uniforms."""
    names = [f"t{i}" for i in range(tricks)]
    effects = effects or {}
    theta = base_logit + difficulty_sd * rng.standard_normal(problems)
    u = seed_sd * rng.standard_normal(seeds)
    variants = {"all": (names, None, 0.0)}
    for t in names:
        variants[f"drop-{t}"] = ([x for x in names if x != t], "all", -effects.get(t, 0.0))
    steps = range(0, STEPS + 1, EVAL_EVERY)
    uniforms = {(s, step): rng.random((problems, samples)) for s in range(seeds) for step in steps}
    bits = {}
    for v, (_, _, delta) in variants.items():
        for s in range(seeds):
            q = logistic(theta + u[s] + run_sd * rng.standard_normal() + delta)[:, None]
            bits.setdefault(v, {})[s] = {step: (uniforms[(s, step)] < q).astype(float) for step in steps}
    if base_shift is not None:
        q = logistic(theta + base_shift)[:, None]
        variants["control-base"] = ([], None, 0.0)
        bits["control-base"] = {s: {step: (uniforms[(s, step)] < q).astype(float) for step in steps}
                                for s in range(seeds)}
    return variants, bits


def null_base_shift(rng, samples=8, seed_sd=0.25, run_sd=0.25, base_logit=1.0, difficulty_sd=1.5, draws=400_000):
    """The shift c that makes the base control's expected pass@n equal a trained arm's under
    `simulate_sampled`'s model (the arms carry seed luck and run noise, the base neither): the boundary
    test's null, found by bisection on a Monte-Carlo estimate of E[1 − (1 − q)^n] over θ, u, w."""
    theta = base_logit + difficulty_sd * rng.standard_normal(draws)
    noise = math.hypot(seed_sd, run_sd) * rng.standard_normal(draws)
    arm = float(np.mean(1.0 - (1.0 - logistic(theta + noise)) ** samples))
    low, high = -3.0, 3.0
    for _ in range(60):
        mid = (low + high) / 2
        base = float(np.mean(1.0 - (1.0 - logistic(theta + mid)) ** samples))
        low, high = (mid, high) if base < arm else (low, mid)
    return (low + high) / 2


def write_sampled_sweep(path, rng, after_training=None, **options):
    """A leave-one-out sweep dir of `simulate_sampled(rng, **options)` with its evals in evals.jsonl (the
    runs' own protocol, `sampled`), or, with `after_training` a name, as `grpo-ablate eval` writes a
    protocol of that name (evals/<name>.json, .jsonl at steps 0 and the last) while the runs' own evals
    stay greedy-like (eval/accuracy of the first sample). Returns (path, bits)."""
    from grpo_ablate.evals.protocol import EvalProtocol
    from grpo_ablate.evals.scores import ProblemScores

    path.mkdir(parents=True)
    variants, bits = simulate_sampled(rng, **options)
    samples = next(iter(next(iter(bits.values())).values()))[0].shape[1]
    protocol = EvalProtocol("sampled", samples, 1.0, pass_k=None, maj_k=()).resolved(parses_answers=False)
    runs = []
    for v, (on, _, _) in variants.items():
        for s, evals in bits[v].items():
            name = f"{v}-s{s}"
            runs.append({"variant": v, "seed": s, "run_dir": name, "config_hash": "x", "status": "completed",
                         "step": STEPS, "reason": None, "final_accuracy": None, "overrides":
                         ["control=base"] if v == "control-base" else []})
            run_dir = path / name
            scored = {step: ProblemScores("sim", b) for step, b in evals.items()}
            own = scored if after_training is None else {step: ProblemScores("sim", b[:, :1])
                                                         for step, b in evals.items()}
            _write_sampled_run(run_dir, v, s, on, own, protocol if after_training is None else None)
            if after_training is not None:
                (run_dir / "evals").mkdir()
                header = {"name": after_training, "protocol": protocol.settings(), "max_new_tokens": 32,
                          "task": {"name": "arithmetic", "eval_size": scored[0].problems}}
                (run_dir / "evals" / f"{after_training}.json").write_text(json.dumps(header))
                (run_dir / "evals" / f"{after_training}.jsonl").write_text("".join(
                    json.dumps(scored[step].row(step)) + "\n" for step in (0, STEPS)))
    names = variants["all"][0]
    manifest = {"version": 1, "sweep_id": "sim", "name": "sim", "mode": "leave-one-out", "base": "grpo",
                "tricks": names, "seeds": sorted(bits["all"]), "overrides": [], "launcher": "joblib",
                "wandb_group": "sim", "created_at": "x", "updated_at": "x",
                "variants": [{"name": v, "tricks_on": on, "overrides": ["control=base"] if v == "control-base" else [],
                              "reference": ref, "kind": "control" if v == "control-base" else "treatment"}
                             for v, (on, ref, _) in variants.items()],
                "contrasts": [{"trick": t, "with": "all", "without": f"drop-{t}"} for t in names], "runs": runs,
                **({"controls": {"base": "control-base"}} if "control-base" in variants else {}),
                "decides_on": {"metric": "eval/accuracy", "summary": "final",
                               **({"eval": after_training} if after_training else {})},
                "checks_training": True}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path, bits


def _write_sampled_run(run_dir, variant, seed, tricks, scored, protocol):
    """A completed run whose evals.jsonl rows hold `scored` (ProblemScores by step); metrics.jsonl logs
    what the trainer logs of them under `protocol` (None: eval/accuracy alone, as a greedy run)."""
    run_dir.mkdir()
    rows = []
    for step in range(0, STEPS + 1):
        row = {"step": step}
        if step:
            row.update({"loss": 0.1, "reward/mean": 0.5, "length/mean": 12.0, "length/truncated_frac": 0.0,
                        "policy/entropy": 0.5, "kl/k3": 0.01, "optim/grad_norm": 0.5, "time/step_s": 0.1})
        if step in scored:
            row.update(scored[step].summaries(protocol) if protocol is not None
                       else {"eval/accuracy": scored[step].value("avg")})
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "evals.jsonl").write_text("".join(json.dumps(s.row(step)) + "\n" for step, s in scored.items()))
    (run_dir / "status.json").write_text(json.dumps({
        "state": "completed", "step": STEPS, "reason": None, "wall_time_s": 10.0, "config_hash": "x",
        "wandb_id": None, "updated_at": "x"}))
    some = next(iter(scored.values()))
    (run_dir / "config.yaml").write_text(yaml.safe_dump({
        "seed": seed, "steps": STEPS, "task": {"name": "arithmetic", "eval_size": some.problems},
        "rollout": {"max_new_tokens": 32}, "tricks": {t: {"family": "x", "option": t} for t in tricks},
        "control": {"name": "base" if variant == "control-base" else "none"},
        "eval": (protocol.settings() | {"name": protocol.name}) if protocol is not None else {"name": "greedy"},
        "run": {"name": f"{variant}-s{seed}", "group": "g", "job_type": variant},
        "sweep": {"name": "sim", "id": "sim", "mode": "leave-one-out", "variant": variant, "tricks": []}}))


# --------------------------------------------------------------------------- summary-scale star sweeps
# The blocked model's scenarios (docs/statistics.md, "The blocked model"): each run's compared number drawn
# directly, y_vs = base + u_s + σ_v e_vs (+ a shared seed shock on some arms) − δ_v, on the k/500 grid, at
# the A/A noise floor: the SD of Δ between two identical arms is SD_DELTA (0.022, the root mean square of
# the ten A/A sweeps' last_3 floors). Row 0 is the hub `all`, row i the leaf `drop-t{i-1}`.
SD_DELTA = 0.022
EVAL_SIZE = 500


def star_table(rng, seeds=5, tricks=6, effects=None, scale=None, shock=0.0, twin=False, noise="normal",
               ceiling=False, seed_sd=0.03, eval_size=EVAL_SIZE):
    """A (tricks + 1) × seeds table of a leave-one-out's numbers. `effects`: trick index -> its true Δ
    (all − drop-t, on the accuracy scale); `scale`: each row's factor on the run noise σ = SD_DELTA/√2;
    `shock`: half the arms (a random ⌊V/2⌋, the hub among them or not) share a seed shock of SD shock·σ;
    `twin`: the last leaf is the hub's exact copy at every seed; `noise`: normal or t3 (Student t, 3 df,
    scaled to the same SD); `ceiling`: accuracies near 0.97, each run's number Binomial(eval_size, p)/eval_size."""
    v = tricks + 1
    sigma = SD_DELTA / math.sqrt(2)
    e = rng.standard_t(3, (v, seeds)) / math.sqrt(3) if noise == "t3" else rng.standard_normal((v, seeds))
    factors = np.ones(v) if scale is None else np.asarray(scale, dtype=float)
    y = (0.97 if ceiling else 0.80) + seed_sd * rng.standard_normal(seeds)[None, :] + sigma * factors[:, None] * e
    if shock:
        arms = rng.choice(v, v // 2, replace=False)
        y[arms] += shock * sigma * rng.standard_normal(seeds)[None, :]
    for i, delta in (effects or {}).items():
        y[1 + i] -= delta
    if twin:
        y[-1] = y[0]
    if ceiling:
        return rng.binomial(eval_size, np.clip(y, 0.0, 1.0)) / eval_size
    return np.round(y * eval_size) / eval_size


def star_names(tricks: int) -> list[str]:
    return ["all"] + [f"drop-t{i}" for i in range(tricks)]


def table_verdicts(y, test="blocked", method="holm", alpha=0.05, eval_size=EVAL_SIZE, missing=(), power=True):
    """The report's verdicts on a star table through its own functions (evidence, settle_family), as
    `grpo-ablate report` decides them on `write_table_sweep`'s dir (tested to agree): trick -> verdict dict.
    `missing`: (row, seed) without a number (a run that failed); `power` False: no detectable |Δ| or price."""
    from grpo_ablate.report.evidence import Evidence
    from grpo_ablate.report.verdicts import settle_family
    from grpo_ablate.stats.exact import breaking_p

    names = star_names(len(y) - 1)
    values = {n: {s: float(x) for s, x in enumerate(row) if (i, s) not in missing} for i, (n, row) in
              enumerate(zip(names, y))}
    evidence = Evidence(values, 1.0 / eval_size, method=method, alpha=alpha, test=test)
    evidence.model([("all", n) for n in names[1:]])
    seeds = y.shape[1]
    failed = lambda i: sum((i, s) in missing for s in range(seeds))
    broke = lambda i: {"with": failed(0), "with_done": seeds, "without": failed(i), "without_done": seeds, "how": "",
                       "p": breaking_p(failed(0), seeds, failed(i), seeds)} if failed(0) + failed(i) else None
    verdicts = [{"trick": n[len("drop-"):], "with": "all", "without": n, "verdict": None, "broke": broke(i),
                 "delta": evidence.delta("all", n)} for i, n in enumerate(names) if i]
    family = settle_family(verdicts, evidence, True, None, power)
    return {v["trick"]: {**v, "family": family} for v in verdicts}


def write_table_sweep(path, y, broken=(), eval_size=EVAL_SIZE):
    """A leave-one-out sweep dir whose run (row v, seed s) logs eval/accuracy y[v, s] at its last eval (and
    at its earlier ones), as the trainer writes it, with no per-problem scores; `broken`: (row, seed) whose
    run diverged before its last eval. The report compares the final eval on the 1/eval_size grid."""
    path.mkdir(parents=True)
    names = star_names(len(y) - 1)
    tricks = [n[len("drop-"):] for n in names[1:]]
    runs = []
    for i, name in enumerate(names):
        on = tricks if i == 0 else [t for t in tricks if t != name[len("drop-"):]]
        for s, x in enumerate(y[i]):
            run = f"{name}-s{s}"
            diverged = (i, s) in broken
            runs.append({"variant": name, "seed": s, "run_dir": run, "config_hash": "x",
                         "status": "diverged" if diverged else "completed", "step": STEPS, "reason": None,
                         "final_accuracy": None, "overrides": []})
            write_table_run(path / run, name, s, on, float(x), diverged, eval_size, 12.0 + i)
    manifest = {"version": 1, "sweep_id": "sim", "name": "sim", "mode": "leave-one-out", "base": "grpo",
                "tricks": tricks, "seeds": list(range(y.shape[1])), "overrides": [], "launcher": "joblib",
                "wandb_group": "sim", "created_at": "x", "updated_at": "x",
                "variants": [{"name": n, "tricks_on": tricks if i == 0 else [t for t in tricks if t != n[5:]],
                              "reference": None if i == 0 else "all", "kind": "treatment", "overrides": []}
                             for i, n in enumerate(names)],
                "contrasts": [{"trick": t, "with": "all", "without": f"drop-{t}"} for t in tricks], "runs": runs}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def write_table_run(run_dir, variant, seed, tricks, final, diverged, eval_size, length=12.0):
    """One run of `write_table_sweep`; each variant logs its own `length/mean` (`length`), so that no two
    variants log identical metrics (which the report would call *inert here* before any test)."""
    run_dir.mkdir()
    last = STEPS // 2 if diverged else STEPS
    rows = []
    for step in range(0, last + 1, EVAL_EVERY if not diverged else 1):
        row = {"step": step}
        if step:
            row.update({"loss": None if diverged and step == last else 0.1, "reward/mean": 0.5, "length/mean": length,
                        "length/truncated_frac": 0.0, "policy/entropy": 0.5, "kl/k3": 0.01,
                        "optim/grad_norm": 0.5, "time/step_s": 0.1})
        if step % EVAL_EVERY == 0 and not (diverged and step == last):
            earlier = round(final * eval_size - (STEPS - step) // 2) / eval_size     # a curve that rises to it
            row["eval/accuracy"] = final if step == STEPS else earlier
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "status.json").write_text(json.dumps({
        "state": "diverged" if diverged else "completed", "step": last,
        "reason": "non-finite loss" if diverged else None, "wall_time_s": 10.0, "config_hash": "x",
        "wandb_id": None, "updated_at": "x"}))
    (run_dir / "config.yaml").write_text(yaml.safe_dump({
        "seed": seed, "steps": STEPS, "task": {"name": "arithmetic", "eval_size": eval_size},
        "rollout": {"max_new_tokens": 32}, "tricks": {t: {"family": "x", "option": t} for t in tricks},
        "run": {"name": f"{variant}-s{seed}", "group": "g", "job_type": variant},
        "sweep": {"name": "sim", "id": "sim", "mode": "leave-one-out", "variant": variant, "tricks": []}}))
