"""An A/A sweep's check of the report itself (`sweep aa`: the reference and K placebos that differ
from it only by their own sampling stream, tested as a leave-one-out's tricks).

Every placebo's true Δ is zero, so the section reads the report's own numbers as a calibration:
the noise floor (the paired SD of Δ between statistically identical arms, per summary the report
compares), the smallest |Δ| these seeds detect (power.py's formula on that floor), and how many
placebos the verdicts named against how often a report of this error control names one by chance.
docs/sweeps.md, "Checking the report on your own runs".
"""
from __future__ import annotations

import math
import statistics

from grpo_ablate.design import differ_only_by_stream
from grpo_ablate.report.verdicts import BREAKS_TRAINING, HELPS, HURTS
from grpo_ablate.stats import group_sequential as seq

NAMED = (HELPS, HURTS, BREAKS_TRAINING)   # a verdict that names an effect: false for every placebo


def chance_of_naming(method: str, alpha: float, tests: int) -> float:
    """How often one report of `tests` null contrasts names at least one: alpha under Holm, and under
    Benjamini–Hochberg too (with every null true the false discovery rate is the family-wise rate);
    without error control, each test at alpha on its own (independent tests: an upper-side guess)."""
    return 1.0 - (1.0 - alpha) ** tests if method == "none" else alpha


def noise_floor(contrasts: list[dict]) -> float | None:
    """The pooled paired SD of Δ over the placebos: the root mean of their variances."""
    sds = [c["sd"] for c in contrasts if c.get("sd") is not None]
    return math.sqrt(statistics.fmean(sd * sd for sd in sds)) if sds else None


def all_placebos(sweep) -> bool:
    """Every contrast is a placebo: its two arms differ by their sampling stream alone (`sweep aa`)."""
    arms = {v.name: v for v in sweep.variants}
    pairs = [(arms.get(c.with_), arms.get(c.without)) for c in sweep.contrasts]
    return bool(pairs) and all(a is not None and b is not None and differ_only_by_stream(a, b) for a, b in pairs)


def placebo_section(report) -> dict | None:
    """The A/A check of a sweep whose every contrast is a placebo (`sweep aa`); None for any other."""
    if not report.verdicts or not all_placebos(report.sweep):
        return None
    verdicts = report.verdicts
    family = verdicts[0]["family"]
    named = [{"placebo": v["trick"], "verdict": v["verdict"], "delta": v["delta"].mean}
             for v in verdicts if v["verdict"] in NAMED]
    seeds = min((v["power"].get("seeds") or 0 for v in verdicts), default=0)
    floors = []
    for s in report.summaries:   # every compared summary; the chosen one decides
        sd = noise_floor(s["contrasts"])
        floors.append({"summary": s["summary"], "chosen": s["chosen"], "sd": sd,
                       "detectable": seq.detectable_effect(sd, seeds) if sd is not None else None})
    return {"placebos": len(verdicts), "seeds": seeds, "named": named, "held": not named,
            "method": family["method"], "alpha": family["alpha"], "label": family["label"],
            "chance": chance_of_naming(family["method"], family["alpha"], len(verdicts)),
            "floors": floors,
            "own_detectable": sorted(v["power"]["detectable_effect"] for v in verdicts
                                     if v["power"].get("detectable_effect") is not None)}


def verdict_line(section: dict) -> str:
    """The one line an A/A report leads with."""
    if section["held"]:
        return f"**A/A check passed: no placebo named** (of {section['placebos']}; {section['label']})."
    n = len(section["named"])
    largest = max(abs(p["delta"]) for p in section["named"] if p["delta"] is not None) if any(
        p["delta"] is not None for p in section["named"]) else None
    size = f" (|Δ| up to {largest:.3f})" if largest is not None else ""
    return (f"**A/A check: {n} placebo(s) named{size} — expected in ~{100 * section['chance']:.0f}% of A/A "
            "reports; rerun with fresh seeds before trusting effects of this size.**")


def section_lines(section: dict, metric: str) -> list[str]:
    """The A/A section of report.md: the verdict, the noise floor and detectable effect per summary,
    and what the error control promises."""
    lines = [verdict_line(section), "",
             f"Every placebo is the reference with its own sampling stream (`rollout.stream_salt`): its true Δ is "
             f"0. This report named {len(section['named'])} of {section['placebos']} "
             f"({', '.join(p['placebo'] + ' ' + p['verdict'] for p in section['named']) or 'none'}); "
             f"with {section['label']} a single A/A report names at least one by chance in about "
             f"{100 * section['chance']:.0f}% of sweeps, so one named placebo in one sweep is not yet a failure; "
             "several sweeps with fresh seeds (`--seeds 5,6,7,8,9`, ...) that name more than that rate predicts are.",
             "",
             f"| summary of `{metric}` | noise floor: SD of Δ between identical arms | smallest Δ detected, either "
             f"sign (80% power, {section['seeds']} seeds, one paired t at 5%, unadjusted) |",
             "|---|---|---|"]
    for f in section["floors"]:
        name = f"**{f['summary']}** (decides)" if f["chosen"] else f["summary"]
        sd = "—" if f["sd"] is None else f"{f['sd']:.4f}"
        detect = "—" if f["detectable"] is None else f"{f['detectable']:.4f}"
        lines.append(f"| {name} | {sd} | {detect} |")
    own = section.get("own_detectable") or []
    if own:
        span = f"{own[0]:.4f}" if own[0] == own[-1] else f"{own[0]:.4f}–{own[-1]:.4f}"
        lines += ["", f"The test this report runs on each placebo (its model, at the level its error control "
                  f"leaves: the Power section) detects |Δ| ≥ {span} with 80% power: a trick sweep of as many "
                  "contrasts on these seeds resolves about that, not the single test's number above."]
    lines += ["", "An effect smaller than the detectable |Δ| of the deciding summary is below what this budget "
              "resolves on your setup: a trick verdict of that size needs more seeds (or eval problems)."]
    return lines
