"""The report's diagnostics tables of a metric the runs logged, per variant, first -> last training step:
sampler truncation (a filtering sampler's kept mass and ratios), input dependence (template collapse:
diag.input_dependence_every), turns (a multi-turn task's turns/*). report/diagnostics.py calls them.
"""
from __future__ import annotations

import numpy as np

from grpo_ablate.report.formatting import fmt_num
from grpo_ablate.report.health import FAILED_TURNS, INPUT_DEPENDENCE


# --------------------------------------------------------------------------- turns
# the per-turn metrics of a multi-turn run (train/metrics.py), as the section shows them
def variants_logging(report, column: str):
    """(variant, its runs that logged `column`) for every variant with one: a diagnostic's rows."""
    for v in report.sweep.variants:
        runs = [r for r in report.sweep.runs if r.variant == v.name and column in r.metrics]
        if runs:
            yield v, runs


TURN_METRICS = ("turns/mean", FAILED_TURNS, "turns/tokens_per_turn")
TURN_REWARD = "turns/turn_reward"   # the episode's summed turn rewards: runs from before it have none


def turns(report) -> list[dict]:
    """Per variant whose runs logged turns/mean (a multi-turn task): each turn metric's first and last
    training-step value, means over the variant's runs (the turn reward too where a run logged it); the
    runs with the tool_failures warning."""
    out = []
    for v, runs in variants_logging(report, TURN_METRICS[0]):
        row = {"variant": v.name, "runs": len(runs),
               "flagged": sum(any(f.name == "tool_failures" for f in r.flags) for r in runs)}
        for column in (*TURN_METRICS, TURN_REWARD):
            ends = [e for e in (_first_and_last(r.metrics, column) for r in runs) if e is not None]
            if ends or column != TURN_REWARD:
                row[column] = {"first": float(np.mean([e[0] for e in ends])) if ends else None,
                               "last": float(np.mean([e[1] for e in ends])) if ends else None}
        out.append(row)
    return out


def turn_lines(rows: list[dict]) -> list[str]:
    rewarded = any(TURN_REWARD in row for row in rows)
    columns = (*TURN_METRICS, TURN_REWARD) if rewarded else TURN_METRICS
    lines = ["## Turns", "",
             "Multi-turn episodes (docs/multi-turn.md), first -> last training step, means over the variant's "
             "runs: policy turns per episode, the share of turns without a usable reply (a call that did not "
             "parse, a tool that refused or raised, a turn cut by its budget) and the policy's tokens per turn"
             + ("; the turn reward, the episode's sum of its turns' own rewards (a tool call that executed)"
                if rewarded else "") + "; *flagged*: runs with the tool_failures warning.", "",
             "| variant | runs | turns / episode | failed turns | tokens / turn | "
             + ("turn reward | " if rewarded else "") + "flagged |",
             "|---|---|---|---|---|" + ("---|" if rewarded else "") + "---|"]
    for row in rows:
        cells = [f"{fmt_num(row[c]['first'])} -> {fmt_num(row[c]['last'])}" if c in row else "—" for c in columns]
        lines.append(f"| {row['variant']} | {row['runs']} | {' | '.join(cells)} | {row['flagged']} |")
    return lines


# --------------------------------------------------------------------------- input dependence
def _first_and_last(metrics, column: str) -> tuple[float, float, int, int] | None:
    """(first, last logged value, their steps) of a column over a run's training steps."""
    if column not in metrics or "step" not in metrics:
        return None
    logged = metrics.loc[metrics["step"] > 0, ["step", column]].dropna()
    if not len(logged):
        return None
    return (float(logged[column].iloc[0]), float(logged[column].iloc[-1]), int(logged["step"].iloc[0]),
            int(logged["step"].iloc[-1]))


def _at(metrics, column: str, step: int) -> float | None:
    if column not in metrics:
        return None
    values = metrics.loc[metrics["step"] == step, column].dropna()
    return float(values.iloc[0]) if len(values) else None


def input_dependence(report) -> list[dict]:
    """Per variant whose runs logged diag/input_dependence (RAGEN-2's template collapse): the mean over
    its runs of the first and the last logged value, the last as a share of the first, and policy/entropy's
    share at the same steps (collapse: the first falls while the second holds); the runs flagged."""
    out = []
    for v in report.sweep.variants:
        runs = [r for r in report.sweep.runs if r.variant == v.name]
        ends = [(r, _first_and_last(r.metrics, INPUT_DEPENDENCE)) for r in runs]
        ends = [(r, e) for r, e in ends if e is not None]
        if not ends:
            continue
        shares, entropy_shares = [], []
        for r, (first, last, first_step, last_step) in ends:
            if first > 0:
                shares.append(last / first)
            h0, h1 = _at(r.metrics, "policy/entropy", first_step), _at(r.metrics, "policy/entropy", last_step)
            if h0 and h1 is not None and h0 > 0:
                entropy_shares.append(h1 / h0)
        mean = lambda xs: float(np.mean(xs)) if xs else None
        out.append({"variant": v.name, "runs": len(ends),
                    "first": mean([e[0] for _, e in ends]), "last": mean([e[1] for _, e in ends]),
                    "last_over_first": mean(shares), "entropy_last_over_first": mean(entropy_shares),
                    "flagged": sum(any(f.name == "template_collapse" for f in r.flags) for r, _ in ends)})
    return out


def dependence_lines(rows: list[dict]) -> list[str]:
    lines = ["## Input dependence", "",
             "How much the completions depend on their prompt (`diag.input_dependence_every`; RAGEN-2's template "
             "collapse): each completion's log-probability under its own prompt minus under another group's "
             "prompt, per token, averaged over a sub-batch (`diag/input_dependence`, nats per token; 0: the policy "
             "ignores its input). Entropy can hold while this falls: the last column sets policy/entropy's own "
             "last-over-first beside it. Means over the variant's runs that logged it; *flagged*: runs with "
             "the template_collapse warning.", "",
             "| variant | runs | first | last | last / first | entropy last / first | flagged |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['variant']} | {row['runs']} | {fmt_num(row['first'])} | {fmt_num(row['last'])} | "
                     f"{fmt_num(row['last_over_first'])} | {fmt_num(row['entropy_last_over_first'])} | "
                     f"{row['flagged']} |")
    return lines


# --------------------------------------------------------------------------- sampler truncation
TRUNCATION_METRICS = ("rollout/kept_mass", "rollout/ratio_mean_full", "rollout/ratio_mean_kept")


def sampler_truncation(report) -> list[dict]:
    """Per variant whose runs logged kept sets: each truncation metric's mean over every logged step."""
    out = []
    for v, runs in variants_logging(report, TRUNCATION_METRICS[0]):
        means = {}
        for column in TRUNCATION_METRICS:
            values = np.concatenate([r.metrics[column].dropna().to_numpy(float) for r in runs
                                     if column in r.metrics] or [np.array([])])
            means[column] = float(values.mean()) if len(values) else None
        replayed = {bool((r.config.get("rollout") or {}).get("sampling_replay", True)) for r in runs}
        out.append({"variant": v.name, "runs": len(runs), "replayed": replayed.pop() if len(replayed) == 1 else None,
                    **means})
    return out


def truncation_lines(rows: list[dict]) -> list[str]:
    lines = ["## Sampler truncation", "",
             "The sampler drew each token from its kept set (rollout.top_k|top_p|min_p), renormalised. Replayed "
             "(`rollout.sampling_replay=true`), the trainer scores the same set: pi_old / mu has mean 1 on the "
             "sampled tokens. Not replayed, it scores the whole vocabulary and the ratio's mean is the kept "
             "mass: every rollout correction and clip reads ratios scaled down by it. Means over every logged "
             "step of the variant's runs.", "",
             "| variant | runs | replayed | kept mass | ratio mean, kept set | ratio mean, vocabulary |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        replayed = {True: "yes", False: "no", None: "mixed"}[row["replayed"]]
        lines.append(f"| {row['variant']} | {row['runs']} | {replayed} | {fmt_num(row['rollout/kept_mass'])} | "
                     f"{fmt_num(row['rollout/ratio_mean_kept'])} | {fmt_num(row['rollout/ratio_mean_full'])} |")
    return lines
