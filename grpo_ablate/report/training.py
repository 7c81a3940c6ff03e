"""Does training beat its untrained start? Asked per context before any trick verdict.

The sweep's reference variant against its context's base control (else its own runs at step 0),
with the trick contrasts' test, one test per context: a family of its own, apart from the trick
contrasts and the controls' comparisons. `advice` only where the test decided it lowers the metric.
Design: docs/controls.md#the-test
"""
from __future__ import annotations

import numpy as np

from grpo_ablate.report.evidence import Evidence
from grpo_ablate.report.load import Sweep, nested_value
from grpo_ablate.report.verdicts import HELPS, HURTS, settle_family
from grpo_ablate.stats.intervals import finite_mean

RAISES, LOWERS = "raises", "lowers"          # which way training moved the metric (the sign of Δ)
START = "step 0"                             # the start when there is no base control: each run's own step 0


def training_section(sweep: Sweep, evidence: Evidence, curves: dict, against: list[dict]) -> dict | None:
    """{contexts: [...], family} or None when the sweep fixed no such test (a manifest from before the test existed)."""
    if not (sweep.checks_training or sweep.context_controls):
        return None
    contexts = [c.name for c in sweep.contexts] or [None]
    checks = [c for c in (context_check(sweep, evidence, curves, ctx) for ctx in contexts) if c is not None]
    if not checks:
        return None
    family = settle_family(checks, evidence, evidence.metric.higher_is_better, None)
    for c in checks:
        c["direction"] = None if c["delta"].mean is None else RAISES if c["delta"].mean > 0 else LOWERS
        c["worse"] = c["verdict"] == HURTS      # decided: training left the metric worse than its start
        c["better"] = c["verdict"] == HELPS
        for role in ("sft", "rft"):   # the reference against the training controls (controls' family)
            c[role] = next((a for a in against if a["variant"] == c["with"] and a["role"] == role), None)
        c["advice"] = advice(sweep, c) if c["worse"] else []   # decided: a finding to act on, not noise
    return {"metric": evidence.metric.name, "family": family, "contexts": checks}


def context_check(sweep: Sweep, evidence: Evidence, curves: dict, context: str | None) -> dict | None:
    """The reference of `context` against its start (the verdict left to the family), or None
    when the context has no reference with a completed run."""
    treatments = [v for v in sweep.variants if v.kind != "control" and v.context == context]
    names = {v.name for v in treatments}
    reference = next((v.name for v in treatments if v.reference not in names), None)
    if reference is None or not evidence.values.get(reference):
        return None
    control = sweep.control_of(context, "base")
    if control and any(x is not None for x in evidence.values.get(control, {}).values()):
        delta, against, start = evidence.delta(reference, control), control, evidence.values[control]
    else:   # no base control: each run's own eval at step 0, paired with its end
        starts = start_evidence(evidence, curves, sweep, reference)
        delta, against, start = starts.delta(reference, START), START, starts.values[START]
    ends = {v: own_change(evidence.values.get(v, {}), curves.get(v, {})) for v in names}
    changes = {v: d for v, d in ends.items() if d is not None}
    return {"trick": f"training@{context}" if context else "training", "context": context,
            "with": reference, "without": against, "verdict": None, "broke": None, "delta": delta,
            "start": finite_mean(list(start.values())), "end": finite_mean(list(evidence.values[reference].values())),
            "changes": changes,   # variant -> its mean change from its own start; all_worse: every one the wrong way
            "all_worse": bool(changes) and all(evidence.metric.worse(d) for d in changes.values())}


def own_change(values: dict, curves: dict) -> float | None:
    """The mean over a variant's runs of its number minus its own eval at step 0 (None without both)."""
    diffs = [values[s] - float(c.values[0]) for s, c in curves.items()
             if s in values and len(c) and c.steps[0] == 0]
    return float(np.mean(diffs)) if diffs else None


def start_evidence(evidence: Evidence, curves: dict, sweep: Sweep, reference: str) -> Evidence:
    """An Evidence holding `reference` and its runs' step-0 evals (as the variant START), paired on
    seeds, with the per-problem scores of step 0 where every run logged them."""
    starts = {s: float(c.values[0]) for s, c in curves.get(reference, {}).items() if len(c) and c.steps[0] == 0}
    runs = {r.key: r for r in sweep.runs if r.variant == reference}
    zero = {s: runs[s].evals[0].metric(evidence.metric.name) if 0 in runs[s].evals else None
            for s in starts if s in runs}
    scores = {}
    if reference in evidence.scores and all(z is not None for z in zero.values()):
        scores = {reference: evidence.scores[reference], START: zero}
    return Evidence({reference: evidence.values[reference], START: starts}, evidence.granularity, scores,
                    evidence.method, evidence.alpha)


# ------------------------------------------------------------------------------ advice
def advice(sweep: Sweep, check: dict) -> list[str]:
    """What usually makes RL lower a warm start's eval, with the knobs to try, from the
    reference's own runs: the lr against how often a group has any signal, the KL penalty, the
    length cap. Suggestions for the next sweep, never verdicts."""
    runs = [r for r in sweep.runs if r.variant == check["with"] and r.state == "completed"]
    if not runs:
        return []
    config = runs[0].config
    lr, beta = nested_value(config, "optim", "lr"), nested_value(config, "kl", "beta")
    cap = nested_value(config, "rollout", "max_new_tokens")
    reward = finite_mean([_first(r.metrics, "reward/mean") for r in runs])
    truncated = finite_mean([_last(r.metrics, "length/truncated_frac") for r in runs])
    kl = finite_mean([_last(r.metrics, "kl/k3") for r in runs])
    out = []
    if isinstance(lr, (int, float)):
        density = f"a mean reward of {reward:.2f} at the first step" if reward is not None else "this reward density"
        out.append(f"learning rate: optim.lr={lr:g} with {density}; where few groups carry a signal the same lr "
                   f"moves the policy on little evidence: try optim.lr={lr / 4:g} (and {lr / 10:g}) in this context")
    if isinstance(beta, (int, float)):
        drift = f" (KL to the start {kl:.3g} at the end)" if kl is not None else ""
        out.append(f"KL: kl.beta={beta:g}{drift} holds the policy near its start; try kl.beta={max(beta * 4, 0.1):g}"
                   + (" (kl=fixed: the sweep ran without a KL term)" if beta == 0 else ""))
    else:
        out.append("KL: these runs had no fixed KL penalty; kl=fixed kl.beta=0.1 holds the policy near its start")
    if isinstance(cap, int):
        hit = (f"{100 * truncated:.0f}% of completions hit it at the end" if truncated is not None
               else "how often completions hit it was not logged")
        verdict = "likely part of it" if truncated is not None and truncated > 0.1 else "a less likely cause"
        out.append(f"length cap: rollout.max_new_tokens={cap}, {hit} ({verdict}); try rollout.max_new_tokens={2 * cap}")
    return out


def _first(metrics, column: str):
    if column not in metrics:
        return None
    values = metrics.loc[metrics["step"] >= 1, column].dropna()
    return float(values.iloc[0]) if len(values) else None


def _last(metrics, column: str):
    if column not in metrics:
        return None
    values = metrics[column].dropna()
    return float(values.iloc[-1]) if len(values) else None
