"""The power of each contrast, and the sequential decisions of a `--seeds auto` sweep.

Per contrast: the seeds it used, the look that decided it (a fixed sweep has one look), and for
one still open the smallest |Δ| its seeds detect with 80% power by the test the report runs on it:
a fixed report's is the contrast's own t-test (the blocked model's SE and df, or the paired t's) at
the level its error control leaves the next rejection (Holm: alpha / (m − k) after k of m tests
decided; `open_level`), a sequential sweep's the boundary of its last look. And, where the report
has a reason to decide a contrast (the --effect the user named, or an unadjusted 95% interval that
excludes 0), about how many seeds the same test needs for 80% power against that effect (the
observed |Δ̂| without --effect: post-hoc, read it as an order of magnitude). A contrast whose
interval spans 0 gets no price without --effect: the report has no reason to decide it. Both numbers
rest on a variance from a few seeds: they are "about". docs/statistics.md, "Power"; the sequential
formulas: `grpo_ablate/stats/group_sequential.py`.

A sweep run with `--seeds auto` keeps its looks in manifest.json (`sequential`). When the
report reads it on the metric and direction the sweep decided on, each contrast is decided by
the group-sequential rule on those looks (`sequential.decide`: the same boundaries the sweep
used), never by the fixed 95% interval, which ignores that the data were looked at
repeatedly. On another metric the looks do not apply, and the report says so.
"""
from __future__ import annotations

import math
import statistics

import numpy as np
from scipy import optimize, special

from grpo_ablate.report.load import Sweep
from grpo_ablate.report.metric import Metric
from grpo_ablate.stats import group_sequential as seq
from grpo_ablate.stats.intervals import Estimate
from grpo_ablate.stats.student import t_quantile


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


def t_power(effect: float, se: float, df: float, level: float) -> float:
    """The power of a two-sided t-test at `level` with standard error `se` and `df` degrees of freedom
    against a true Δ = effect: P(|T'| ≥ c), T' ~ noncentral t(df, effect / se), c = t_{1 − level/2, df}
    (scipy.special's noncentral t, which scipy.stats.nct calls: tests/test_report_power.py)."""
    c = t_quantile(1.0 - level / 2.0, df)
    ncp = abs(effect) / se
    upper = 1.0 - float(special.nctdtr(df, ncp, c))
    lower = 1.0 - float(special.nctdtr(df, -ncp, c))     # P(T' ≤ −c) as P(T' ≥ c) at −ncp (see fixed_power)
    return min(1.0, max(0.0, upper) + (max(0.0, lower) if math.isfinite(lower) else 0.0))


_QUANTILES = (np.arange(48) + 0.5) / 48      # of the variance's uncertainty, for planning_power


def planning_power(effect: float, se: float, df: float, level: float, info_df: float) -> float:
    """The power of the t-test (`se`, `df`, two-sided at `level`) against a true Δ = effect, averaged over
    what `info_df` degrees of freedom leave unknown of its variance: the true variance se² · info_df / X,
    X ~ χ²(info_df), at 48 equally spaced quantiles of X (the predictive power of a planned study: its
    variance is an estimate, not the truth). Simulated through the report (docs/statistics.md, "Power"),
    info_df = 2(S − 1) for a blocked contrast (its two arms' own variances, S − 1 df each) puts a sweep
    with the detectable Δ at 81% detected; the test's own df (24 at 7 × 5) at 75%."""
    x = special.chdtri(info_df, 1.0 - _QUANTILES) / info_df
    c = t_quantile(1.0 - level / 2.0, df)
    ncp = abs(effect) * np.sqrt(x) / se
    upper = 1.0 - special.nctdtr(df, ncp, c)
    lower = np.nan_to_num(1.0 - special.nctdtr(df, -ncp, c))
    return float(np.clip(np.maximum(upper, 0.0) + np.maximum(lower, 0.0), 0.0, 1.0).mean())


def info_df(delta: Estimate) -> float:
    """How many df the variance of a contrast's test is known to, for planning: its own df, at most the two
    arms' own S − 1 each (a blocked contrast's pooled df rest on the arms being alike, which the model
    can check only on S − 1 df an arm)."""
    return min(float(delta.df), 2.0 * (delta.n - 1))


def detectable_delta(se: float, df: float, level: float, power: float = seq.POWER,
                     info: float | None = None) -> float | None:
    """The smallest true |Δ| the test (`se`, `df`, two-sided at `level`) detects with `power`, its variance
    known to `info` df (planning_power; None: known exactly, t_power); None without a spread."""
    if not (se and se > 0 and df and df > 0):
        return None
    hi = se
    while t_power(hi, se, df, level) < power:
        hi *= 2.0
    plain = float(optimize.brentq(lambda e: t_power(e, se, df, level) - power, 0.0, hi, xtol=1e-9 * se))
    if info is None:
        return plain
    at = lambda e: planning_power(e, se, df, level, info) - power
    lo, hi = (plain, 1.25 * plain) if at(plain) < 0 else (0.0, plain)   # an unknown variance costs power
    while at(hi) < 0:
        lo, hi = hi, 1.25 * hi
    return float(optimize.brentq(at, lo, hi, xtol=1e-9 * se))


def seeds_for(effect: float, delta: Estimate, level: float, power: float = seq.POWER,
              limit: int = seq.SEEDS_NEEDED_LIMIT) -> int | None:
    """About how many seeds the contrast's own test needs for `power` against a true |Δ| = effect at
    `level`: its SE shrinks as 1/√seeds and its df grow with the seeds (df · (N − 1)/(n − 1): a paired t's
    n − 1, a blocked model's (V − 1)(S − 1) alike), its variance known to what these seeds know (info_df,
    planning_power). None when effect is 0, there is no spread, or more than `limit` would be needed."""
    n, se, df = delta.n, delta.se, delta.df
    effect = abs(effect)
    if not effect > 0 or not (se and se > 0) or n < 2 or not df:
        return None
    info = info_df(delta)     # what these seeds know of the variance, as for the detectable |Δ|
    at = lambda m: planning_power(effect, se * math.sqrt(n / m), df * (m - 1) / (n - 1), level, info)
    if at(limit) < power:
        return None
    lo, hi = 2, limit
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if at(mid) < power else (lo, mid)
    return lo


def open_level(method: str, alpha: float, tests: int, rejected: int) -> float:
    """The level an open contrast's p must beat for the report to decide it next: Holm's alpha / (m − k)
    after k of its m tests were rejected, Benjamini–Hochberg's (k + 1) alpha / m, alpha without error
    control."""
    if method == "holm":
        return alpha / max(1, tests - rejected)
    if method == "bh":
        return alpha * (rejected + 1) / max(1, tests)
    return alpha


def reason_to_decide(delta: Estimate, effect: float | None) -> str | None:
    """Why the report would price deciding an open contrast: the effect the user named (--effect), or an
    unadjusted 95% interval that excludes 0 (a Δ the error control did not confirm); None: no reason
    (an interval that spans 0, no interval, no spread)."""
    if not delta.has_ci or delta.zero_spread:
        return None
    if effect is not None:
        return "the effect named (--effect)"
    if delta.low > 0 or delta.high < 0:
        return "its unadjusted 95% CI excludes 0"
    return None


def fixed_power(delta: Estimate, level: float, effect: float | None, decided: bool, solve: bool = True) -> dict:
    """A fixed report's power numbers for one contrast (module docstring): seeds, the SE and df of its
    test, the level an open one must beat, the smallest |Δ| detected with 80% power there, and, where
    the report has a reason to decide it, the seeds the test needs against that effect (`solve` False:
    neither, for verdicts whose power nobody reads: the exploratory summaries, the sensitivity line)."""
    sd = None
    if delta.se is not None and delta.n >= 2 and delta.mean is not None:
        sd = round(delta.se * math.sqrt(delta.n), 12)
    out = {"seeds": delta.n, "sd": sd, "se": delta.se, "df": delta.df, "level": level,
           "detectable_effect": None, "seeds_needed": None, "seeds_needed_for": None, "reason": None,
           "look": 1 if decided else None, "sequential": False}
    if decided or delta.se is None or delta.df is None or not solve:
        return out
    found = detectable_delta(delta.se, delta.df, level, info=info_df(delta))
    out["detectable_effect"] = None if found is None else round(found, 9)
    reason = reason_to_decide(delta, effect)
    if reason is not None:
        target = effect if effect is not None else abs(delta.mean)
        out.update(reason=reason, seeds_needed_for=round(target, 12), seeds_needed=seeds_for(target, delta, level))
    return out


PRICED_SEEDS = 64    # the most seeds per variant the report's first line puts a price on


def cost_to_decide(verdicts: list[dict], undecided: tuple, runs) -> dict:
    """What deciding the open contrasts the report has a reason to decide would take (a fixed report:
    `reason_to_decide`; a sequential sweep's: every open one): per variant the most extra seeds any of
    them needs, those runs, and their time at the median wall time of the completed runs. Those with
    a reason but no number (more than PRICED_SEEDS, no spread) are counted apart; the detectable |Δ|
    of the open ones (the smallest and largest) beside."""
    extra: dict[str, int] = {}
    unpriced, priced = [], []
    open_ = [v for v in verdicts if v["verdict"] in undecided]
    for v in open_:
        p = v["power"]
        if not p.get("sequential") and p.get("reason") is None:
            continue                   # no reason to decide it: no price (an interval that spans 0)
        # seeds needed for the observed |Δ| is post-hoc power: from five seeds it can say 6 or 1,100
        # for the same truth (docs/statistics.md); past PRICED_SEEDS the sum would be noise, so it is named, not priced
        if not p.get("seeds_needed") or p["seeds_needed"] > PRICED_SEEDS:
            unpriced.append(v["trick"])
            continue
        priced.append(v["trick"])
        more = max(0, p["seeds_needed"] - p["seeds"])
        for variant in (v["with"], v["without"]):
            extra[variant] = max(extra.get(variant, 0), more)
    walls = [r.wall_time_s for r in runs if r.state == "completed" and r.wall_time_s]
    run_s = statistics.median(walls) if walls else None
    n_runs = sum(extra.values())
    detectable = [v["power"]["detectable_effect"] for v in open_ if v["power"].get("detectable_effect") is not None]
    return {"decided": len(verdicts) - len(open_), "contrasts": len(verdicts), "extra_seeds": extra,
            "runs": n_runs, "run_seconds": run_s, "seconds": n_runs * run_s if run_s is not None else None,
            "unpriced": unpriced, "priced": priced,
            "detectable": [min(detectable), max(detectable)] if detectable else None}
