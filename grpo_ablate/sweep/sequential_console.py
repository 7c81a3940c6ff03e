"""What a sequential sweep (`--seeds auto`) prints: each look, each contrast's decision, the plan.

A look's one line (what it ran, what it decided, what is still open), each contrast in words
(its outcome, seeds, numbers and, while open, its power) and the dry run's plan: the first
look, the most it can grow to, and what that costs in wall time (console.py's timing).
"""
from __future__ import annotations

import math

from grpo_ablate.stats import group_sequential as seq
from grpo_ablate.sweep.console import duration, expected_wall, run_timing
from grpo_ablate.sweep.plan import SweepRequest

UNDECIDED = "undecided"   # a contrast's outcome while more seeds could still decide it


def say(console, text: str) -> None:
    """One plain line (no rich markup or highlighting: names and overrides print as they are)."""
    console.print(text, markup=False, highlight=False)


def compared(section: dict) -> str:
    """What the looks compare: the metric, or its summary when that is not the final value."""
    summary = section.get("summary", "final")
    return section["metric"] if summary == "final" else f"the {summary} of {section['metric']}"


def _num(x, fmt="+.3f") -> str:
    return "-" if x is None else format(x, fmt)


def look_text(manifest: dict) -> str:
    """One line per look: what it ran, what it decided, what is open."""
    section = manifest["sequential"]
    look = section["looks"][-1]
    decisions = look["decisions"] or []
    what = f"seeds {', '.join(map(str, sorted(manifest['seeds'])[:section['initial_seeds']]))}" \
        if look["seed"] is None else f"+seed {look['seed']}"
    now = [f"{d['name']} {d['outcome']} ({d['n']} seeds)" for d in decisions if d["decided_at_look"] == look["look"]]
    open_ = [f"{d['name']} (Δ {_num(d['mean'])}, t {_num(d.get('t'), '.2f')} of ±{_num(d.get('boundary'), '.2f')})"
             for d in decisions if d["outcome"] == UNDECIDED]
    decided = sum(d["outcome"] != UNDECIDED for d in decisions)
    return (f"look {look['look']} ({what}, {len(look['runs'])} runs, {look['wall_s'] or 0:.0f} s): "
            f"{decided} of {len(decisions)} contrasts decided"
            + (f"; decided now: {'; '.join(now)}" if now else "")
            + (f"; open: {'; '.join(open_[:6])}{' ...' if len(open_) > 6 else ''}" if open_ else ""))


def decision_text(d: dict) -> str:
    """One contrast in words: its outcome, seeds, numbers and, when open, its power."""
    numbers = f"Δ {_num(d['mean'])}" + (f", t {_num(d.get('t'), '.2f')} (boundary ±{_num(d.get('boundary'), '.2f')})"
                                         if d.get("t") is not None else "")
    if d["outcome"] != UNDECIDED:
        return f"{d['name']}: {d['outcome']} at look {d['decided_at_look']} ({d['n']} seeds; {d.get('why') or numbers})"
    text = f"{d['name']}: undecided after {d['n']} seeds ({numbers})"
    if d.get("detectable_effect") is not None:
        text += f"; these seeds detect |Δ| >= {d['detectable_effect']:.3f} with 80% power"
    if d.get("seeds_needed"):
        text += f"; about {d['seeds_needed']} seeds would detect |Δ| = {d['seeds_needed_for']:.3f}"
    elif d.get("sd") and d.get("mean"):
        text += f"; |Δ| = {abs(d['mean']):.3f} would need more than {seq.SEEDS_NEEDED_LIMIT} seeds"
    elif d.get("why"):
        text += f"; {d['why']}"
    return text + (" [re-planned: about 7% false helps/hurts, not 5%]" if d.get("replanned") else "")


def print_decisions(manifest: dict, console) -> None:
    section = manifest["sequential"]
    decisions = section["looks"][-1]["decisions"] or []
    stopped = section.get("stopped") or {}
    decided = sum(d["outcome"] != UNDECIDED for d in decisions)
    say(console, f"sequential sweep {manifest['name']}: stopped ({stopped.get('reason')}) after "
                  f"{len(section['looks'])} look(s), max {section['max_seeds']} seeds; {decided} of {len(decisions)} "
                  f"contrasts decided on {compared(section)}:")
    for d in decisions:
        say(console, "  - " + decision_text(d))


def planner_text(manifest: dict, req: SweepRequest) -> str:
    """--dry-run: the first look, the most it can grow to, and what that costs in wall time."""
    section = manifest["sequential"]
    variants, first = len(manifest["variants"]), len(manifest["runs"])
    most = variants * section["max_seeds"]
    looks = section["max_seeds"] - section["initial_seeds"] + 1
    text = (f"seeds auto: look 1 = {variants} variants x {section['initial_seeds']} seeds = {first} runs; then one "
            f"seed per look to the variants of open contrasts, at most {looks} looks and {most} runs "
            f"({section['max_seeds']} seeds); decided on {compared(section)} with false helps/hurts <= 5% overall")
    measured = run_timing(req)
    if measured is None:
        return text + "\n" + expected_wall(first, req) + "; each look prints its time"
    per_run, source, parallel = measured
    wall = lambda runs: math.ceil(runs / parallel) * per_run
    later = (looks - 1) * wall(variants)
    text += (f"\nexpected wall time ({per_run:.0f} s a run, {source}; {parallel} at a time): look 1 "
             f"~{duration(wall(first))}, at most ~{duration(wall(first) + later)}")
    if section.get("budget_s"):
        text += f"; --budget {duration(section['budget_s'])} stops it earlier"
    return text
