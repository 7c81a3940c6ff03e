"""Verdicts that travel: one trick across the contexts a sweep ran it in.

The design, its formulas and references: docs/contexts.md, "Transfer verdicts".
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from grpo_ablate.report.claims import (NOT_TESTED, claim_matches, context_tags, judge, named_trick,
                                       registered_claims)
from grpo_ablate.report.metric import Metric
from grpo_ablate.report.verdicts import BREAKS_TRAINING, HELPS, HURTS, INERT, NO_EFFECT
from grpo_ablate.stats import group_sequential as seq
from grpo_ablate.stats.aggregate import probability_of_improvement
from grpo_ablate.stats.error_control import holm
from grpo_ablate.stats.intervals import Estimate, welch_test

ALPHA = 0.05           # family-wise over the grid: every pair of contexts of every trick
HOLDS = "holds across the contexts tested"
CONTEXT_DEPENDENT = "context-dependent"
SIGN_FLIPS = "sign flips"
UNDECIDED = "undecided"
TRANSFER_VERDICTS = (HOLDS, CONTEXT_DEPENDENT, SIGN_FLIPS, UNDECIDED)
# a decided per-context verdict as a direction: +1 better, -1 worse, 0 decided nothing to gain
DIRECTION = {HELPS: 1, HURTS: -1, BREAKS_TRAINING: -1, INERT: 0, NO_EFFECT: 0}
CERTAIN = (INERT, BREAKS_TRAINING)   # decided by a rule on the runs, not by an interval


@dataclass
class Cell:
    """One trick in one context: its verdict, Δ and the per-seed paired Δs the interaction reads."""
    context: str
    verdict: str
    delta: Estimate
    diffs: list = field(default_factory=list)
    seeds_needed: int | None = None      # for an open verdict: seeds a fixed design needs (power.py)


# --------------------------------------------------------------------------- the interaction
def welch_p(a: list[float], b: list[float]) -> float | None:
    """Two-sided p-value of Welch's t-test on mean(a) − mean(b) (stats/intervals.py), in plain
    floats; None without a test (n < 2, or no spread on either side)."""
    if len(a) < 2 or len(b) < 2:
        return None
    found = welch_test(_mean(a) - _mean(b), _var(a), len(a), _var(b), len(b))
    return None if found is None else found[2]


def _certain_pair(a: Cell, b: Cell) -> bool:
    """Two verdicts that differ for certain: inert (identical runs) against a decided effect,
    or breaks training against helps."""
    da, db = DIRECTION.get(a.verdict), DIRECTION.get(b.verdict)
    if da is None or db is None or da == db:
        return False
    return (a.verdict == INERT and db != 0) or (b.verdict == INERT and da != 0) or \
        {a.verdict, b.verdict} == {BREAKS_TRAINING, HELPS}


def transfer_verdicts(cells: dict[str, list[Cell]], alpha: float = ALPHA, plan: bool = True) -> list[dict]:
    """A transfer verdict per trick from its cells (one per context), the interaction decided
    by Holm over every pair of contexts of every trick; `plan`: say what would decide an
    undecided one (a power calculation: the simulations leave it out)."""
    pairs = [(trick, a, b) for trick, cs in cells.items() for a, b in itertools.combinations(cs, 2)]
    pvalues = [welch_p(a.diffs, b.diffs) for _, a, b in pairs]
    tested = [i for i, p in enumerate(pvalues) if p is not None]
    rejected = dict(zip(tested, holm([pvalues[i] for i in tested], alpha)))
    out = []
    for trick, cs in cells.items():
        mine = [(i, a, b) for i, (t, a, b) in enumerate(pairs) if t == trick]
        pair_rows = [{"a": a.context, "b": b.context, "difference": _mean(a.diffs) - _mean(b.diffs)
                      if a.diffs and b.diffs else None, "p": pvalues[i],
                      "decided": bool(rejected.get(i)) or _certain_pair(a, b),
                      "how": "certain" if _certain_pair(a, b) else "Welch + Holm"} for i, a, b in mine]
        verdict, why = classify(cs, pair_rows)
        out.append({"trick": trick, "transfer": verdict, "why": why, "tests": len(tested), "alpha": alpha,
                    "cells": [{"context": c.context, "verdict": c.verdict, "delta": c.delta, "n": len(c.diffs)}
                              for c in cs], "pairs": pair_rows,
                    "to_decide": to_decide(cs, pair_rows, len(tested), alpha) if plan and verdict == UNDECIDED
                    else None})
    return out


def classify(cs: list[Cell], pairs: list[dict]) -> tuple[str, str]:
    """The transfer verdict of one trick and why, in words."""
    direction = {c.context: DIRECTION.get(c.verdict) for c in cs}
    decided = [p for p in pairs if p["decided"]]
    where = "; ".join(f"*{c.verdict}* in {c.context}" for c in cs)
    if len(cs) < 2:
        return UNDECIDED, f"tested in one context only ({where})"
    flips = [p for p in decided if direction[p["a"]] and direction[p["b"]]
             and direction[p["a"]] == -direction[p["b"]]]
    if flips:
        p = flips[0]
        return SIGN_FLIPS, f"{where}; the difference between {p['a']} and {p['b']} is decided"
    values = set(direction.values())
    if None not in values and len(values) == 1:
        same = ", ".join(sorted({c.verdict for c in cs}))
        size = ("; its size differs: " + ", ".join(_pair_text(p) for p in decided)) if decided else ""
        return HOLDS, f"*{same}* in every context ({len(cs)}){size}"
    if decided:
        return CONTEXT_DEPENDENT, f"{where}; decided differences: " + ", ".join(_pair_text(p) for p in decided)
    opposite = {d for d in values if d} == {1, -1}
    return UNDECIDED, where + ("; opposite decided directions, but their difference is not decided "
                               "over the grid" if opposite else "; no difference between contexts decided")


def _pair_text(p: dict) -> str:
    if p["how"] == "certain" or p["difference"] is None:
        return f"{p['a']} vs {p['b']} (decided by the verdicts themselves)"
    return f"{p['a']} − {p['b']} = {p['difference']:+.3f} (p = {p['p']:.3g})"


def to_decide(cs: list[Cell], pairs: list[dict], tests: int, alpha: float) -> str:
    """What would decide an undecided trick: seeds per context for its open verdicts, and for
    the largest observed difference between contexts at the grid's Bonferroni level."""
    parts = [f"{c.context}: ~{c.seeds_needed} seeds" for c in cs if c.seeds_needed and c.verdict not in DIRECTION]
    by = {c.context: c for c in cs}
    open_ = [(p, by[p["a"]], by[p["b"]]) for p in pairs
             if p["difference"] and len(by[p["a"]].diffs) > 1 and len(by[p["b"]].diffs) > 1
             and _var(by[p["a"]].diffs) + _var(by[p["b"]].diffs) > 0]
    if open_:
        p, a, b = max(open_, key=lambda x: abs(x[0]["difference"]))
        sd = math.sqrt(_var(a.diffs) + _var(b.diffs))
        n = seq.seeds_needed(p["difference"], sd, level=alpha / max(tests, 1))
        parts.append(f"the difference {p['a']} − {p['b']} ({p['difference']:+.3f}): "
                     + (f"~{n} seeds per context" if n else f"more than {seq.SEEDS_NEEDED_LIMIT} seeds per context"))
    return "; ".join(parts) if parts else "no spread to plan from: more seeds, or name --effect"


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _var(xs: list[float]) -> float:
    """The sample variance (n - 1), in plain floats: the simulations call it a million times."""
    m = _mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


# --------------------------------------------------------------------------- claims
def claims_rows(trick_claims: dict[str, list], cells: dict[str, list[Cell]], tags: dict[str, dict]) -> list[dict]:
    """Per claim of each trick the sweep measured: per context, agrees / contradicts / undecided
    here / not tested here. `trick_claims`: a trick of the report -> its claims (registered_claims():
    effect, where, source, says, measure); `tags`: context -> its tags. Claims about the ceiling are
    left to the one-context section (report/claims.py): the cells here are level verdicts."""
    rows = []
    for trick, claims in trick_claims.items():
        for claim in claims:
            if claim["measure"] != "level":
                continue
            by_context = {c.context: judge(claim["effect"], c.verdict) if claim_matches(claim["where"], tags[c.context])
                          else NOT_TESTED for c in cells.get(trick, [])}
            rows.append({"trick": trick, **claim, "contexts": by_context})
    return rows


# --------------------------------------------------------------------------- from a sweep
def transfer_section(sweep, verdicts: list[dict], values: dict, metric: Metric) -> dict | None:
    """The report's section across contexts (None for a sweep in one context): the contexts and
    their tags, a transfer verdict per trick with its trick × context cells and its probability of
    improvement stratified by context (rliable), and the claims beside the measurements."""
    if not sweep.contexts:
        return None
    cells: dict[str, list[Cell]] = {}
    sides: dict[str, list[tuple]] = {}
    for v in verdicts:
        if not v.get("context"):
            continue
        with_, without = values.get(v["with"], {}), values.get(v["without"], {})
        diffs = [with_[s] - without[s] for s in sorted(set(with_) & set(without), key=str)]
        cells.setdefault(v["tests"], []).append(Cell(v["context"], v["verdict"], v["delta"], diffs,
                                                     v["power"].get("seeds_needed")))
        sides.setdefault(v["tests"], []).append((v["context"], v["with"], v["without"]))
    tricks = transfer_verdicts(cells)
    for t in tricks:        # P(a run with the trick beats one without), each context one task
        pairs = sides[t["trick"]]
        t["improvement"] = probability_of_improvement(
            {ctx: list(values.get(w, {}).values()) for ctx, w, _ in pairs},
            {ctx: list(values.get(wo, {}).values()) for ctx, _, wo in pairs},
            higher_is_better=metric.higher_is_better)
    config_of = {}
    for r in sweep.runs:
        context = next((v.context for v in sweep.variants if v.name == r.variant), None)
        if context and r.config and context not in config_of:
            config_of[context] = r.config
    tags = {c.name: context_tags(config_of.get(c.name)) for c in sweep.contexts}
    named = {trick: next((n for _, w, wo in sides[trick] if (n := named_trick(trick, w, wo, sweep))), None)
             for trick in cells}
    registered = registered_claims()
    claimed = {trick: registered[name] for trick, name in named.items() if name in registered}
    return {"contexts": [{"name": c.name, "overrides": list(c.overrides), "tags": tags[c.name]}
                         for c in sweep.contexts],
            "tricks": tricks, "alpha": ALPHA, "tests": tricks[0]["tests"] if tricks else 0,
            "named": named, "claims": claims_rows(claimed, cells, tags)}
