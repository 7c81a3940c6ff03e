"""The report's diagnostics sections: gradient conflicts, pairwise interactions, conflict checks,
sampler truncation, input dependence, turns. build.py calls `analyse`, render.py `markdown_sections`, plots.py
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
from grpo_ablate.report.health import FAILED_TURNS, INPUT_DEPENDENCE
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


def _turn_lines(rows: list[dict]) -> list[str]:
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


def _dependence_lines(rows: list[dict]) -> list[str]:
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


def _truncation_lines(rows: list[dict]) -> list[str]:
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
        out += _truncation_lines(diag["sampler_truncation"]) + [""]
    if "input_dependence" in diag:
        out += _dependence_lines(diag["input_dependence"]) + [""]
    if "turns" in diag:
        out += _turn_lines(diag["turns"]) + [""]
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
