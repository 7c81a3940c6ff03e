"""The report's diagnostics sections: gradient conflicts, pairwise interactions, conflict checks, and
the tables of a metric the runs logged (sampler truncation, input dependence, turns:
report/logged_diagnostics.py). build.py calls `analyse`, render.py `markdown_sections`, plots.py
`plot`; like the rest of the report it reads only what the runs logged and imports no torch. A section
appears where the runs allow it: `diag.grad_conflict=true`; any pair's four variants {}, {a}, {b}, {a, b}
(I_ab = m(ab) − m(a) − m(b) + m(base)); a `conflict` sweep; a sampler that filtered (top_k|p, min_p);
`diag.input_dependence_every` > 0 (template collapse); a multi-turn task (turns/*).
Design: docs/diagnostics.md (each section's rule), docs/sampling-replay.md (the truncation table).
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from grpo_ablate.report.curves import final_value, kl_column
from grpo_ablate.report.formatting import fmt_estimate, fmt_num
from grpo_ablate.report.logged_diagnostics import (dependence_lines, input_dependence, sampler_truncation,
                                                  truncation_lines, turn_lines, turns)
from grpo_ablate.stats.intervals import Estimate, delta_ci, mean_ci, satterthwaite
from grpo_ablate.stats.student import t_quantile

DEFAULT_CONFLICT_THRESHOLD = -0.1
COS_PREFIX, NORM_PREFIX = "grad_cos/", "grad_norm/"
# what a conflict check compares besides the report's metric (Δ vs base of the last value)
DIRECTION_METRICS = ("length/mean", "policy/entropy", "kl")


def analyse(report, conflict_threshold: float = DEFAULT_CONFLICT_THRESHOLD) -> dict:
    """Every diagnostics section that this sweep's runs support (empty when none does)."""
    out = {}
    conflicts = gradient_conflicts(report, conflict_threshold)
    if conflicts:
        out["gradient_conflicts"] = {"threshold": conflict_threshold, "variants": conflicts}
    pairs = interactions(report)
    if pairs:
        out["interactions"] = pairs
    check = conflict_check(report, conflict_threshold)
    if check:
        out["conflict_check"] = check
    truncation = sampler_truncation(report)
    if truncation:
        out["sampler_truncation"] = truncation
    dependence = input_dependence(report)
    if dependence:
        out["input_dependence"] = dependence
    episodes = turns(report)
    if episodes:
        out["turns"] = episodes
    return out


# --------------------------------------------------------------------------- gradient conflicts
def cosine_series(runs, column: str) -> np.ndarray:
    """Every logged value of one grad_cos column over these runs, pooled."""
    values = [r.metrics[column].dropna().to_numpy(float) for r in runs if column in r.metrics]
    return np.concatenate(values) if values else np.array([])


def pair_summary(values: np.ndarray, threshold: float) -> dict:
    below = int((values < threshold).sum())
    return {"steps": int(len(values)), "median": float(np.median(values)), "below": below,
            "conflict": 2 * below > len(values)}


def gradient_conflicts(report, threshold: float) -> list[dict]:
    """Per variant that logged gradient cosines: every pair's summary, conflicting ones marked."""
    out = []
    for v in report.sweep.variants:
        runs = [r for r in report.sweep.runs if r.variant == v.name]
        columns = sorted({c for r in runs for c in r.metrics.columns if c.startswith(COS_PREFIX)})
        pairs = []
        for column in columns:
            values = cosine_series(runs, column)
            if len(values):
                a, b = column[len(COS_PREFIX):].split("__", 1)
                pairs.append({"a": a, "b": b, **pair_summary(values, threshold)})
        if pairs:
            out.append({"variant": v.name, "runs": sum(any(c.startswith(COS_PREFIX) for c in r.metrics.columns)
                                                          for r in runs), "pairs": pairs})
    return out


def _conflict_lines(section: dict) -> list[str]:
    th = section["threshold"]
    lines = ["## Gradient conflicts", "",
             "Cosine between the gradients of two loss terms, or of the policy term driven by two reward "
             "components alone, on the same sub-batch and weights (`diag.grad_conflict=true`; gradients "
             "w.r.t. the last `diag.last_layers` blocks, logged every `diag.every` steps). A pair *conflicts* "
             f"when its cosine is below {th:g} (`--conflict-threshold`) at more than half of its logged steps, "
             "pooled over the variant's runs: a step that helps one term undoes the other.", ""]
    for v in section["variants"]:
        bad = [p for p in v["pairs"] if p["conflict"]]
        if bad:
            listed = "; ".join(f"{p['a']} × {p['b']} (median cos {p['median']:+.2f}, {p['below']}/{p['steps']} "
                               f"steps below {th:g})" for p in bad)
            lines.append(f"- **{v['variant']}**: conflicting: {listed}.")
        else:
            lines.append(f"- **{v['variant']}**: no conflicting pair among the {len(v['pairs'])} logged.")
    lines += ["", "| variant | pair | logged steps | median cos | steps below | conflict |",
              "|---|---|---|---|---|---|"]
    for v in section["variants"]:
        for p in v["pairs"]:
            lines.append(f"| {v['variant']} | {p['a']} × {p['b']} | {p['steps']} | {p['median']:+.3f} | "
                         f"{p['below']} | {'yes' if p['conflict'] else '—'} |")
    return lines


# --------------------------------------------------------------------------- interactions
def _finals(report) -> dict[str, dict]:
    """variant -> {seed: the report's summary of the metric} over its completed runs (as its verdicts)."""
    out = {v.name: {} for v in report.sweep.variants}
    for r in report.sweep.runs:
        if r.state == "completed" and r.variant in out:
            value = report.summary(r.metrics, report.metric, report.higher_is_better)
            if value is not None and math.isfinite(value):
                out[r.variant][r.key] = value
    return out


def interaction_ci(ab: dict, a: dict, b: dict, base: dict, level: float = 0.95) -> Estimate:
    """I = m(ab) − m(a) − m(b) + m(base) with its interval. Paired over seeds when all four
    have the same seeds (the per-seed I_s is then a t-interval); otherwise the four means are
    independent: var = Σ s_i²/n_i with Welch–Satterthwaite degrees of freedom (each n_i >= 2)."""
    sides = [ab, a, b, base]
    if not all(sides):
        return Estimate()
    if all(s.keys() == ab.keys() for s in sides):
        seeds = sorted(ab, key=str)
        est = mean_ci([ab[s] - a[s] - b[s] + base[s] for s in seeds], level)
        est.basis = f"paired over seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
        return est
    arrays = [np.array(list(s.values()), dtype=float) for s in sides]
    signs = (1.0, -1.0, -1.0, 1.0)
    mean = float(sum(sign * x.mean() for sign, x in zip(signs, arrays)))
    basis = "Welch, n=" + "/".join(str(len(x)) for x in arrays) + " (seeds differ)"
    n_min = min(len(x) for x in arrays)
    if n_min < 2:
        return Estimate(mean, None, None, n_min, basis + ", no CI")
    found = satterthwaite([(x.var(ddof=1) / len(x), len(x)) for x in arrays])
    if found is None:
        return Estimate(mean, mean, mean, n_min, basis)
    var, df = found
    half = t_quantile(0.5 + level / 2, df) * math.sqrt(var)
    return Estimate(mean, mean - half, mean + half, n_min, basis)


def _reading(est: Estimate, higher_is_better: bool) -> str:
    if est.mean is None:
        return "no estimate: a variant has no completed run"
    if not est.has_ci:
        return "no verdict: one seed" if est.n <= 1 and "Welch" not in est.basis else "no verdict: no interval"
    if est.low <= 0.0 <= est.high:
        return "no evidence of an interaction (CI spans 0)"
    if est.low == est.high:
        return "no verdict: every seed gave the same value (zero-width CI)"
    return "synergy" if (est.low > 0) == higher_is_better else "conflict"


def interactions(report) -> list[dict]:
    """Every pair of tricks whose base, singles and pair are all in the sweep."""
    by_set = {frozenset(v.tricks_on): v.name for v in report.sweep.variants}
    base = by_set.get(frozenset())
    if base is None:
        return []
    singles = [next(iter(s)) for s in by_set if len(s) == 1]
    order = {t: i for i, t in enumerate(t for v in report.sweep.variants for t in v.tricks_on)}
    singles.sort(key=lambda t: order.get(t, 0))
    finals = _finals(report)
    runs_of = {v.name: [r for r in report.sweep.runs if r.variant == v.name] for v in report.sweep.variants}
    out = []
    for a, b in itertools.combinations(singles, 2):
        pair = by_set.get(frozenset((a, b)))
        if pair is None:
            continue
        va, vb = by_set[frozenset((a,))], by_set[frozenset((b,))]
        est = interaction_ci(finals[pair], finals[va], finals[vb], finals[base])
        reading = _reading(est, report.higher_is_better)
        broke = lambda name: [r for r in runs_of[name] if r.state in ("completed", "diverged") and r.broken]
        if broke(pair) and not broke(va) and not broke(vb):
            reading += f"; the pair broke training in {len(broke(pair))} run(s), neither trick alone did"
        out.append({"a": a, "b": b, "pair_variant": pair, "interaction": est, "reading": reading,
                    "delta_a": delta_ci(finals[va], finals[base]),
                    "delta_b": delta_ci(finals[vb], finals[base]),
                    "delta_ab": delta_ci(finals[pair], finals[base])})
    return out


def _interaction_lines(report, pairs: list[dict]) -> list[str]:
    m = report.metric
    lines = ["## Interactions", "",
             f"I_ab = Δ_ab − Δ_a − Δ_b on `{m}`, Δ = variant − base; equivalently m(ab) − m(a) − m(b) + m(base). "
             "Positive: *synergy* (the pair does better than its two effects added up); negative: *conflict*"
             + (" (the metric is a cost here: the other way round)" if not report.higher_is_better else "")
             + ". 95% CI paired by seed when the four variants share their completed seeds, else Welch.", "",
             "| a | b | Δ_a | Δ_b | Δ_ab | interaction I_ab (95% CI) | basis | reading |",
             "|---|---|---|---|---|---|---|---|"]
    for p in pairs:
        est = p["interaction"]
        ci = (f"{fmt_num(est.mean, signed=True)} [{fmt_num(est.low, signed=True)}, {fmt_num(est.high, signed=True)}]"
              if est.has_ci else fmt_num(est.mean, signed=True))
        lines.append(f"| {p['a']} | {p['b']} | {fmt_estimate(p['delta_a'], True)} | "
                     f"{fmt_estimate(p['delta_b'], True)} | {fmt_estimate(p['delta_ab'], True)} | {ci} | "
                     f"{est.basis} | {p['reading']} |")
    lines += ["", "The heatmap `interactions.png` (under Figures) draws I_ab for every pair."]
    return lines


# --------------------------------------------------------------------------- conflict check
def _terms(runs) -> set[str]:
    return {c[len(NORM_PREFIX):] for r in runs for c in r.metrics.columns if c.startswith(NORM_PREFIX)}


def _pair_values(runs, a: str, b: str) -> np.ndarray:
    for column in (f"{COS_PREFIX}{a}__{b}", f"{COS_PREFIX}{b}__{a}"):
        values = cosine_series(runs, column)
        if len(values):
            return values
    return np.array([])


def _direction(est: Estimate) -> str:
    """+ / − when the CI excludes 0, 0 when it spans it, +? / −? from the means alone (no CI)."""
    if est.mean is None:
        return "n/a"
    if est.has_ci and est.low <= 0.0 <= est.high:
        return "0"
    sign = "+" if est.mean > 0 else "−" if est.mean < 0 else "0"
    return sign if est.has_ci or sign == "0" else sign + "?"


def _agreement(d1: str, d2: str) -> str:
    if "n/a" in (d1, d2) or "0" in (d1, d2):
        return "unclear"
    same = d1[0] == d2[0]
    word = "agree" if same else "disagree"
    return word if not (d1.endswith("?") or d2.endswith("?")) else word + " (means only)"


def conflict_check(report, threshold: float) -> dict | None:
    """A conflict sweep's three variants (`sweep conflict` names them): base, trick-X, reward-Y."""
    names = {v.name for v in report.sweep.variants}
    trick = next((n for n in names if n.startswith("trick-")), None)
    reward = next((n for n in names if n.startswith("reward-")), None)
    if "base" not in names or trick is None or reward is None:
        return None
    runs_of = {n: [r for r in report.sweep.runs if r.variant == n] for n in ("base", trick, reward)}
    rows = []
    for column in (report.metric, *DIRECTION_METRICS):
        values = {}
        for n, runs in runs_of.items():
            values[n] = {}
            for r in runs:
                col = kl_column(r.metrics) if column == "kl" else column
                value = final_value(r.metrics, col) if col and r.state == "completed" else None
                if value is not None and math.isfinite(value):
                    values[n][r.key] = value
        d_trick, d_reward = delta_ci(values[trick], values["base"]), delta_ci(values[reward], values["base"])
        if d_trick.mean is None and d_reward.mean is None:
            continue
        dirs = (_direction(d_trick), _direction(d_reward))
        rows.append({"metric": "KL" if column == "kl" else column, "delta_trick": d_trick, "delta_reward": d_reward,
                     "direction_trick": dirs[0], "direction_reward": dirs[1], "agreement": _agreement(*dirs)})
    agreements = [row["agreement"] for row in rows]
    if any(a.startswith("disagree") for a in agreements):
        overall = "disagree"
    elif any(a.startswith("agree") for a in agreements):
        overall = "agree"
    else:
        overall = "unclear"

    base_terms = _terms(runs_of["base"])
    gradients = []
    for role, name, anchor in (("reward term", reward, "task_reward"), ("trick", trick, "policy")):
        new = sorted(_terms(runs_of[name]) - base_terms - {"task_reward"})
        for term in new:
            values = _pair_values(runs_of[name], anchor, term)
            if len(values) == 0 and anchor == "task_reward":
                anchor_used, values = "policy", _pair_values(runs_of[name], "policy", term)
            else:
                anchor_used = anchor
            if len(values):
                gradients.append({"role": role, "variant": name, "term": term, "against": anchor_used,
                                  **pair_summary(values, threshold)})
        if not new:
            gradients.append({"role": role, "variant": name, "term": None, "against": None,
                              "steps": 0, "median": None, "below": 0, "conflict": False})
    return {"trick_variant": trick, "reward_variant": reward, "rows": rows, "overall": overall,
            "gradients": gradients, "threshold": threshold}


def _check_lines(report, check: dict) -> list[str]:
    trick, reward = check["trick_variant"], check["reward_variant"]
    advice = {"agree": "their effects point the same way: running them together is the next step",
              "disagree": "they pull the run in different directions: do not combine them yet",
              "unclear": "no direction is clear on either side: more seeds or steps before deciding"}[check["overall"]]
    lines = [f"## Conflict check: {trick[len('trick-'):]} vs {reward[len('reward-'):]}", "",
             f"The seed review's section 4.3: the base, base + the trick (`{trick}`) and base + the reward term "
             f"alone (`{reward}`), separately. **Directions: {check['overall']}** — {advice}.", "",
             "Δ vs base of the last logged value (mean ± 95% CI over seeds); direction + / − when the CI "
             "excludes 0, 0 when it spans it, +? / −? from means alone (no CI).", "",
             f"| metric | Δ {trick} | Δ {reward} | directions | |", "|---|---|---|---|---|"]
    for row in check["rows"]:
        lines.append(f"| {row['metric']} | {fmt_estimate(row['delta_trick'], True)} | "
                     f"{fmt_estimate(row['delta_reward'], True)} | {row['direction_trick']} / "
                     f"{row['direction_reward']} | {row['agreement']} |")
    lines += ["", "Gradients (from `grad_cos/*` of the same runs): the new term of each variant against the "
              "task reward's gradient (the reward term) or the policy term's (the trick).", ""]
    for g in check["gradients"]:
        if g["term"] is None:
            lines.append(f"- {g['role']} (`{g['variant']}`): adds no separate loss term or reward component, so "
                         "its gradient is not separable from the policy term's; only the directions above compare it.")
        else:
            lines.append(f"- {g['role']} (`{g['variant']}`): cos({g['term']}, {g['against']}) "
                         f"median {g['median']:+.2f}, "
                         f"below {check['threshold']:g} at {g['below']}/{g['steps']} steps"
                         + (" — **it pushes against it**" if g["conflict"] else "") + ".")
    return lines


# --------------------------------------------------------------------------- rendering
def markdown_sections(report) -> list[str]:
    diag = getattr(report, "diagnostics", None) or {}
    out = []
    if "conflict_check" in diag:
        out += _check_lines(report, diag["conflict_check"]) + [""]
    if "interactions" in diag:
        out += _interaction_lines(report, diag["interactions"]) + [""]
    if "gradient_conflicts" in diag:
        out += _conflict_lines(diag["gradient_conflicts"]) + [""]
    if "sampler_truncation" in diag:
        out += truncation_lines(diag["sampler_truncation"]) + [""]
    if "input_dependence" in diag:
        out += dependence_lines(diag["input_dependence"]) + [""]
    if "turns" in diag:
        out += turn_lines(diag["turns"]) + [""]
    return out


def plot(report, out_dir) -> list[tuple[str, str]]:
    """The interaction heatmap (interactions.png): I_ab per pair, CI in the cell, blue synergy,
    red conflict; a cell whose CI spans zero is hatched."""
    pairs = (getattr(report, "diagnostics", None) or {}).get("interactions") or []
    if not pairs:
        return []
    tricks = list(dict.fromkeys([p["a"] for p in pairs] + [p["b"] for p in pairs]))
    index = {t: i for i, t in enumerate(tricks)}
    grid = np.full((len(tricks), len(tricks)), np.nan)
    for p in pairs:
        if p["interaction"].mean is not None:
            grid[index[p["a"]], index[p["b"]]] = grid[index[p["b"]], index[p["a"]]] = p["interaction"].mean
    # the colour scale spans the CIs too, so a small mean inside a wide interval stays pale
    ends = [abs(x) for p in pairs for x in (p["interaction"].mean, p["interaction"].low, p["interaction"].high)
            if x is not None]
    limit = max(ends, default=0.0) or 1.0
    size = 1.6 + 1.3 * len(tricks)
    from matplotlib.figure import Figure   # here: a report without figures never imports matplotlib
    from matplotlib.patches import Rectangle

    fig = Figure(figsize=(size + 1.5, size))
    ax = fig.subplots()
    image = ax.imshow(grid, cmap="RdBu" if report.higher_is_better else "RdBu_r", vmin=-limit, vmax=limit)
    for p in pairs:
        est = p["interaction"]
        text = "—" if est.mean is None else f"{est.mean:+.3f}" + (
            f"\n[{est.low:+.3f}, {est.high:+.3f}]" if est.has_ci else "\n(no CI)")
        spans = est.has_ci and est.low <= 0.0 <= est.high
        for i, j in ((index[p["a"]], index[p["b"]]), (index[p["b"]], index[p["a"]])):
            dark = est.mean is not None and abs(est.mean) > 0.6 * limit   # white on a deep colour
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if dark else "black")
            if spans:
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", lw=0, alpha=0.4))
    ax.set_xticks(range(len(tricks)), tricks, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(tricks)), tricks, fontsize=8)
    fig.colorbar(image, ax=ax, label=f"Δ_ab − Δ_a − Δ_b ({report.metric})")
    ax.set_title("Interactions, 95% CI (hatched: CI spans 0)\n"
                 + ("blue: synergy, red: conflict" if report.higher_is_better
                    else "cost metric: blue synergy, red conflict"),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out_dir / "interactions.png", dpi=110)
    return [("Interactions", "interactions.png")]
