"""The reasoning boundary: does training widen what the policy can solve in n tries, or only sharpen
what it already could (the 2025 question of Yue et al., arXiv 2504.13837: pass@k at large k of the
trained policy against its base)? Asked wherever the eval draws n >= 2 samples per problem.

- The curve: each arm's pass@k for k = 1..n at its final eval (mean over its seeds; Chen et al.'s
  unbiased estimator from the n samples, stats/pass_at_k.py), the untrained base's beside it.
- Against the base, on pass@n: each trained arm minus the base control (else each run's own start,
  its step-0 eval), paired on seeds; one test per arm, Holm over the arms, a family of its own.
  *narrows* the boundary: the arm's pass@n decided below the base's; *widens*: above.
- Per trick, on pass@n: the sweep's contrasts tested as its verdicts are (the blocked model where they
  form a star), in a family of their own: what a claim about pass@k is judged by (report/claims.py);
  and on avg@n, another family of their own, for a claim about avg@k where the report decides on
  something else (where it decides on avg@n, its own verdicts judge).
"""
from __future__ import annotations

from grpo_ablate.evals.protocol import PASS
from grpo_ablate.report.curves import Curve, Summary
from grpo_ablate.report.evidence import gather
from grpo_ablate.report.load import Sweep
from grpo_ablate.report.metric import Metric
from grpo_ablate.report.protocols import EvalSource
from grpo_ablate.report.verdicts import HELPS, HURTS, contrast_verdicts, settle_family
from grpo_ablate.stats.intervals import finite_mean

NARROWS, WIDENS = "narrows", "widens"        # the boundary verdicts (a decided Δ pass@n vs the base)
START = "step 0"                             # the base when there is no base control: each seed's start


def boundary_section(sweep: Sweep, source: EvalSource, runs_of: dict, curves: dict, method: str, alpha: float,
                     test: str, averages: tuple[dict, dict] | None = None) -> dict | None:
    """{k, metric, curves, against, arms, family, tricks, tricks_family, tricks_avg}; None where the eval
    draws one sample per problem, or the sweep runs across contexts. `averages`: (runs_of, curves) of
    eval/accuracy (avg@n), for the per-trick family on it (none without)."""
    n = source.protocol.samples
    if n < 2 or sweep.contexts:
        return None
    metric = Metric(f"eval/pass@{n}")
    final = Summary("final")
    values = {name: {seed: final.of(c) for seed, c in cs.items()} for name, cs in curves.items()}
    base = sweep.control_of(None, "base")
    if not (base and any(v is not None for v in values.get(base, {}).values())):
        base = START
        values[START], starts = start_values(runs_of, curves, n)
    paired = gather(values, runs_of, curves, metric, final, method, alpha, "paired")
    if base == START and paired.scores:
        paired.scores[START] = starts
    treatments = [v.name for v in sweep.variants if v.kind != "control" and values.get(v.name)]
    arms = [{"trick": name, "with": name, "without": base, "verdict": None, "broke": None,
             "delta": paired.delta(name, base)} for name in treatments]
    family = settle_family(arms, paired, True, None) if arms else None
    for arm in arms:
        arm["verdict"] = {HELPS: WIDENS, HURTS: NARROWS}.get(arm["verdict"], arm["verdict"])
    tricks = per_trick(sweep, runs_of, curves, metric, method, alpha, test)
    tricks_avg = per_trick(sweep, *averages, Metric("eval/accuracy"), method, alpha, test) if averages else []
    return {"k": n, "metric": metric.name, "against": base, "curves": pass_curves(sweep, runs_of, curves, n, base),
            "arms": arms, "family": family, "tricks": tricks,
            "tricks_family": next((t["family"] for t in tricks if t.get("family")), None), "tricks_avg": tricks_avg}


def per_trick(sweep: Sweep, runs_of: dict, curves: dict, metric: Metric, method: str, alpha: float,
              test: str) -> list[dict]:
    """The sweep's contrasts on each run's final `metric`, tested as its verdicts are, as a family of their own."""
    if not sweep.contrasts:
        return []
    final = Summary("final")
    values = {name: {seed: final.of(c) for seed, c in cs.items()} for name, cs in curves.items()}
    blocked = gather(values, runs_of, curves, metric, final, method, alpha, test)
    blocked.model([(c.with_, c.without) for c in sweep.contrasts])
    areas = {name: {seed: Summary("auc").of(c) for seed, c in cs.items()} for name, cs in curves.items()}
    return contrast_verdicts(sweep, blocked, areas, None, None, power=False)


def final_scores(run, curve: Curve):
    """The ProblemScores of a run's final eval (the last step its curve has), None without them."""
    return run.evals.get(int(curve.steps[-1])) if len(curve) else None


def pass_curves(sweep: Sweep, runs_of: dict, curves: dict, n: int, base: str) -> dict:
    """variant -> {k: mean over its seeds of pass@k at the final eval} for k = 1..n (and, when the base
    is each seed's start, START -> the same at step 0)."""
    scored = {}
    for name, cs in curves.items():
        by_seed = {r.key: r for r in runs_of.get(name, [])}
        scored[name] = [s for seed, c in cs.items() if seed in by_seed
                        and (s := final_scores(by_seed[seed], c)) is not None]
    if base == START:
        scored[START] = list(start_scores(runs_of, curves).values())
    return {name: {k: finite_mean([s.value(PASS, k) for s in each if s.has(PASS, k)]) for k in range(1, n + 1)}
            for name, each in scored.items() if each}


def start_scores(runs_of: dict, curves: dict) -> dict:
    """seed -> the ProblemScores of its start (step 0), from the first of its completed runs that scored it:
    every arm of a seed starts from the same weights and draws its step-0 eval from the same key
    (evals/score.py), so any one of them is the seed's start."""
    out = {}
    for name, runs in runs_of.items():
        for run in runs:
            if run.state == "completed" and run.key not in out and run.key in curves.get(name, {}) and 0 in run.evals:
                out[run.key] = run.evals[0]
    return out


def start_values(runs_of: dict, curves: dict, n: int) -> tuple[dict, dict]:
    """({seed: pass@n of its start}, {seed: its per-problem values})."""
    starts = {seed: s for seed, s in start_scores(runs_of, curves).items() if s.has(PASS, n)}
    per_problem = {seed: s.per_problem(PASS, n) for seed, s in starts.items()}
    return {seed: float(p.mean()) for seed, p in per_problem.items()}, per_problem
