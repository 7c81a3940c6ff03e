"""The power of each contrast, and the sequential decisions of a `--seeds auto` sweep.

Per contrast: the paired seeds it used, the look that decided it (a fixed sweep has one
look), and for one still open the smallest |Δ| its seeds detect with 80% power at the
report's level (the fixed 5% t-test, or the sequential boundary of its last look), from the
observed paired SD, and about how many seeds a fixed 5% design needs for 80% power against an
effect the size of the current estimate (or the user's --effect). Both rest on an SD from a
few seeds: they are "about". Formulas: `grpo_ablate/stats/group_sequential.py`.

A sweep run with `--seeds auto` keeps its looks in manifest.json (`sequential`). When the
report reads it on the metric and direction the sweep decided on, each contrast is decided by
the group-sequential rule on those looks (`sequential.decide`: the same boundaries the sweep
used), never by the fixed 95% interval, which ignores that the data were looked at
repeatedly. On another metric the looks do not apply, and the report says so.
"""
from __future__ import annotations

import math
import statistics

from grpo_ablate.report.load import Sweep
from grpo_ablate.report.metric import Metric
from grpo_ablate.stats import group_sequential as seq


def sequential_section(sweep: Sweep, metric: Metric, summary: str = "final") -> tuple[dict | None, str | None]:
    """(the manifest's sequential section, None) when its looks decide this report; (None, why
    not) when the sweep was sequential but on another metric, summary or direction; (None, None)
    else. A sweep recorded before summaries existed decided on `final`."""
    section = sweep.sequential
    if not section:
        return None, None
    looked = section.get("summary", "final")
    if (section.get("metric") != metric.name or looked != summary
            or bool(section.get("higher_is_better", True)) != metric.higher_is_better):
        direction = "higher" if section.get("higher_is_better", True) else "lower"
        of = lambda label: "" if looked == summary == "final" else f"the {label} of "
        return None, (f"this sweep decided its looks on {of(looked)}`{section.get('metric')}` ({direction} is "
                      f"better); on {of(summary)}`{metric.name}` the verdicts use fixed 95% intervals, which do not "
                      "account for those looks")
    return section, None


def contrast_alpha(section: dict, kind: str) -> float:
    """The alpha one contrast of `kind` (trick | control) spends over its looks: the sweep's level
    split evenly over its family (Bonferroni: the whole sweep's chance of any false call ≤ alpha
    whatever the contrasts' dependence). A sweep recorded before the split (no `families`) spent
    the whole level on each contrast."""
    alpha = float(section.get("alpha", seq.ALPHA))
    families = section.get("families")
    return alpha / max(1, int(families.get(kind) or 1)) if isinstance(families, dict) else alpha


def sequential_guarantee(section: dict) -> str:
    """What the sweep's looks guarantee, in words."""
    families = section.get("families")
    level = f"{100 * float(section.get('alpha', seq.ALPHA)):g}%"
    if isinstance(families, dict) and families.get("trick"):
        return (f"false helps/hurts ≤ {level} over all looks and all {families['trick']} trick contrasts "
                f"(Bonferroni: {100 * contrast_alpha(section, 'trick'):.3g}% each)")
    return f"false helps/hurts ≤ {level} over all looks, per contrast (a sweep recorded before the split)"


def plan_of(section: dict, effect: float | None, kind: str = "trick") -> seq.Plan:
    return seq.Plan(section["initial_seeds"], section["max_seeds"], contrast_alpha(section, kind),
                    section.get("spending", "obrien-fleming"), effect if effect is not None else section.get("effect"))


def recorded_looks(section: dict, name: str, sign: float = 1.0) -> list[seq.Look]:
    """A contrast's looks as the sweep took them (n, maximum, mean Δ × sign, SD), in order."""
    looks = []
    for look in section.get("looks") or []:
        for d in look.get("decisions") or []:
            if d.get("name") == name and d.get("sd") is not None and d.get("max_seeds") and d.get("mean") is not None:
                looks.append(seq.Look(int(d["n"]), int(d["max_seeds"]), sign * float(d["mean"]), float(d["sd"])))
    return looks


def sequential_decision(section: dict, name: str, effect: float | None, two_sided: bool,
                        metric: Metric) -> tuple[seq.Decision, seq.Look] | None:
    """The rule on a contrast's recorded looks (a one-sided test is on the better side), and
    its last look; None when it has none."""
    sign = 1.0 if two_sided else metric.sign
    looks = recorded_looks(section, name, sign)
    if not looks:
        return None
    return seq.decide(looks, plan_of(section, effect, "trick" if two_sided else "control"), two_sided), looks[-1]


def power_numbers(look: seq.Look | None, effect: float | None, critical: float | None = None) -> dict:
    """seeds, the smallest detectable |Δ| (80%), the seeds needed for |Δ̂| (or `effect`)."""
    if look is None:
        return {"seeds": 0, "detectable_effect": None, "seeds_needed": None, "seeds_needed_for": None}
    target = effect if effect is not None else abs(look.mean)
    usable = critical is None or math.isfinite(critical)
    detectable = seq.detectable_effect(look.sd, look.n, critical=critical) if usable else None
    # rounded: a root-finder's last digits are not a result (and report.json stays stable)
    return {"seeds": look.n, "sd": round(look.sd, 12) if look.n > 1 else None,
            "detectable_effect": None if detectable is None else round(detectable, 9),
            "seeds_needed": seq.seeds_needed(target, look.sd), "seeds_needed_for": round(target, 12)}


PRICED_SEEDS = 64    # the most seeds per variant the report's first line puts a price on


def cost_to_decide(verdicts: list[dict], undecided: tuple, runs) -> dict:
    """What deciding the open contrasts would take: per variant the most extra seeds any of its
    open contrasts needs, those runs, and their time at the median wall time of the completed
    runs. Contrasts with no number (|Δ̂| ≈ 0, no spread) are counted apart."""
    extra: dict[str, int] = {}
    unpriced = []
    open_ = [v for v in verdicts if v["verdict"] in undecided]
    for v in open_:
        p = v["power"]
        # seeds needed for the observed |Δ| is post-hoc power: from five seeds it can say 6 or 1,100
        # for the same truth (docs/statistics.md); past PRICED_SEEDS the sum would be noise, so it is named, not priced
        if not p.get("seeds_needed") or p["seeds_needed"] > PRICED_SEEDS:
            unpriced.append(v["trick"])
            continue
        more = max(0, p["seeds_needed"] - p["seeds"])
        for variant in (v["with"], v["without"]):
            extra[variant] = max(extra.get(variant, 0), more)
    walls = [r.wall_time_s for r in runs if r.state == "completed" and r.wall_time_s]
    run_s = statistics.median(walls) if walls else None
    n_runs = sum(extra.values())
    return {"decided": len(verdicts) - len(open_), "contrasts": len(verdicts), "extra_seeds": extra,
            "runs": n_runs, "run_seconds": run_s, "seconds": n_runs * run_s if run_s is not None else None,
            "unpriced": unpriced}
