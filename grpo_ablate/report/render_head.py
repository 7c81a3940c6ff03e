"""The top of report.md: the title, at most four one-sentence lines (an A/A sweep's check, the family and
its error control, training against its untrained start, the cost of deciding the rest) and the verdict
table, so that a reader meets the verdicts first; the full cost of the open
contrasts for the Power section and the SFT control's headline for the controls section."""
from __future__ import annotations

from grpo_ablate.evals.protocol import parse_metric
from grpo_ablate.report.build import Report
from grpo_ablate.report.formatting import fmt_num, fmt_p
from grpo_ablate.report.placebo import verdict_line as placebo_line
from grpo_ablate.report.power import PRICED_SEEDS, sequential_guarantee
from grpo_ablate.report.render_training import training_line
from grpo_ablate.report.verdicts import BEATS, BREAKS_TRAINING, NO_COMPARISON, UNDECIDED

# what each error control holds its level to, after the family's label ("6 tests, Holm, 5%")
HOLDS = {"holm": "family-wise", "bh": "false discovery rate", "none": "per test"}


def head_lines(report: Report) -> list[str]:
    """Title, the lines above the verdict table, the table, and a blank line: report.md's first
    table is the verdict table, within its first 8 lines (tests/test_report.py)."""
    s = report.sweep
    title = f"# Report: {s.name}" + (f" ({s.sweep_id})" if s.sweep_id else "")
    if not report.verdicts:
        return [title, "", *filter(None, [training_line(report)]),
                "No contrasts: this sweep has no pair of variants that differ by one trick; its variants follow.", ""]
    lines = [placebo_line(report.placebo) if report.placebo else None, family_line(report), training_line(report),
             decided_line(report)]
    sensitivity = sensitivity_line(report)
    return [title, "", *(f"- {line}" for line in lines if line), "", *verdict_table(report), "",
            *([sensitivity, ""] if sensitivity else [])]


def sensitivity_line(report: Report) -> str | None:
    """Below the verdict table: what a paired t per contrast decides on the same numbers (the
    blocked model's borrowing, shown rather than hidden); None when the report used it already."""
    s = report.sensitivity
    if not s:
        return None
    decided = [f"{t} {v['verdict']}" for t, v in s["verdicts"].items() if v["verdict"] not in UNDECIDED]
    return (f"Sensitivity: a paired t per contrast ({s['label']}, `--test paired`) decides {s['decided']} of "
            f"{s['contrasts']}" + (f": {', '.join(decided)}." if decided else "."))


def family(report: Report) -> dict | None:
    """The trick contrasts' family (verdicts.settle_family); None for a sequential sweep's looks."""
    return next((v["family"] for v in report.verdicts if v.get("family")), None)


def family_line(report: Report) -> str:
    """Which tests decided, at what error rate, and on what number."""
    p, fam = report.power, family(report)
    if p["sequential"]:
        how = (f"sequential, {p['looks']} look(s) up to {p['max_seeds']} seeds, stopped: "
               f"{p.get('stopped') or 'not yet'}; " + sequential_guarantee(report.sweep.sequential))
    elif fam:
        # .get: a method this renderer does not know yet still reads as its label
        how = " ".join(filter(None, [fam["label"], HOLDS.get(fam["method"])])) + (
            f" ({fam['model']})" if fam.get("model") else "")
    else:
        how = "fixed 95% intervals"
    direction = "higher" if report.higher_is_better else "lower"
    exploratory = f" (**exploratory**: the sweep fixed another {fixed_what(report)}; see How to read this)" \
        if report.exploratory else ""
    compared = ("each run's final" if report.summary.how == "final" else f"each run's {report.summary.label} of")
    return f"**Verdicts**{exploratory}: {how}; compared on {compared} {metric_words(report)} ({direction} is better)."


def fixed_what(report: Report) -> str:
    """What the sweep fixed before its first run that this report departs from: its eval, metric or summary."""
    fixed = report.sweep.decides_on or {}
    used = report.eval.name if report.eval is not None and report.eval.after_training else None
    if fixed.get("eval") != used and not (report.eval is not None and fixed.get("eval") == report.eval.name):
        return "eval"
    return "metric" if fixed.get("metric") != report.metric else "summary"


def metric_words(report: Report) -> str:
    """The compared metric, and the eval it comes from where that is not the runs' own greedy eval."""
    e = report.eval
    if e is None or parse_metric(report.metric) is None or (e.protocol.greedy and not e.after_training):
        return f"`{report.metric}`"
    kind, k = parse_metric(report.metric)
    what = f"avg@{e.protocol.samples}" if kind == "avg" else f"{kind}@{k}"
    return f"`{report.metric}` ({what} of {e.describe()})"


def decided_line(report: Report) -> str | None:
    """How many contrasts were decided, the smallest |Δ| the report's own test detects among the open
    ones, and, in short, what deciding those it has a reason to decide would take (power.cost_to_decide)."""
    p = report.power
    if not p.get("contrasts"):
        return None
    undecided = p["contrasts"] - p["decided"]
    if not undecided:
        return f"**All {p['contrasts']} contrasts decided.**"
    line = f"**{p['decided']} of {p['contrasts']} contrasts decided**"
    if p.get("detectable") and not p["sequential"]:
        low, high = p["detectable"]
        size = fmt_num(low) if fmt_num(low) == fmt_num(high) else f"{fmt_num(low)}–{fmt_num(high)}"
        line += f"; the open ones' test detects |Δ| ≥ {size} with 80% power"
    if p["runs"]:
        which = f"the other {undecided - len(p['unpriced'])}" if p["sequential"] else ", ".join(p["priced"])
        line += (f"; deciding {which}: about {p['runs']} more runs (up to "
                 f"{max(p['extra_seeds'].values())} more seeds for {len(p['extra_seeds'])} variants)"
                 + (f" ≈ {fmt_duration(p['seconds'])}" if p["seconds"] is not None else "")
                 + (", past this sweep's --max-seeds" if past_max_seeds(p) else ""))
    if p["unpriced"]:
        line += f"; no seed count for {', '.join(p['unpriced'])} (more than {PRICED_SEEDS} seeds, or no spread)"
    return line + (" (see Power)." if p.get("detectable") or p["runs"] or p["unpriced"] else ".")


def past_max_seeds(power: dict) -> bool:
    return bool(power["sequential"] and power.get("stopped") == "max seeds")


def cost_lines(report: Report) -> list[str]:
    """The Power section's opening: the cost of deciding the open contrasts in full."""
    p = report.power
    undecided = p["contrasts"] - p["decided"]
    if not undecided:
        return []
    line = ""
    if p["runs"]:
        most = max(p["extra_seeds"].values())
        cost = (f"≈ {fmt_duration(p['seconds'])} at {p['run_seconds']:.3g} s a run "
                "(median of this sweep's completed runs)"
                if p["seconds"] is not None else "(no completed run to time)")
        which = (", ".join(p.get("priced") or []) if not p["sequential"]
                 else f"the other {undecided - len(p['unpriced'])}")
        line += (f"Deciding {which} would take about {p['runs']} more runs "
                 f"(up to {most} more seeds for {len(p['extra_seeds'])} variants) {cost}")
        line += (" — past this sweep's --max-seeds: `grpo-ablate sweep --resume DIR --max-seeds N` re-plans "
                 "them (about 7% false helps/hurts, not 5%)." if past_max_seeds(p) else ".")
    if p["unpriced"]:
        line += (f" No seed count for {', '.join(p['unpriced'])} (more than {PRICED_SEEDS} seeds, or no spread "
                 "over seeds).")
    reasonless = undecided - len(p.get("priced") or []) - len(p["unpriced"])
    if reasonless and not p["sequential"]:
        line += (f" {reasonless} open contrast{'s' * (reasonless != 1)} without a price: an interval that spans 0 "
                 "(or none, no spread) is no reason to decide a contrast; name the smallest effect that matters "
                 "with `--effect` to price it.")
    return [line.strip(), ""] if line else []


def fmt_duration(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def verdict_table(report: Report) -> list[str]:
    """One row per contrast: Δ with its unadjusted 95% CI, the p-value that decided it, the verdict."""
    sequential = report.power["sequential"]
    fam = family(report)
    third = "decided at look" if sequential else "p" if fam and fam["method"] == "none" else "adjusted p"
    lines = [f"| trick | Δ (with − without) [95% CI] | {third} | verdict |", "|---|---|---|---|"]
    for v in report.verdicts:
        d = v["delta"]
        delta = "—" if d.mean is None else fmt_num(d.mean, signed=True) + (
            f" [{fmt_num(d.low, signed=True)}, {fmt_num(d.high, signed=True)}]" if d.has_ci else f" (n={d.n}, no CI)")
        decided = str(v["power"].get("look") or "—") if sequential else deciding_p(v)
        verdict = f"**{v['verdict']}**" if v["verdict"] not in UNDECIDED else v["verdict"]
        cells = [v["trick"], delta, decided, verdict]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return lines


def deciding_p(v: dict) -> str:
    """The family-adjusted p that decided the verdict: the exact test of broken runs for *breaks
    training*, else Δ's; — where nothing was tested (inert, one seed, zero spread)."""
    broke = v.get("broke") or {}
    if v["verdict"] == BREAKS_TRAINING and broke.get("p_adjusted") is not None:
        return f"{fmt_p(broke['p_adjusted'])} (runs that broke)"
    d = v["delta"]
    return fmt_p(d.p_adjusted if d.p_adjusted is not None else d.p)


def controls_summary(report: Report) -> str | None:
    """The controls section's headline: against the RFT control where the sweep has one
    (rft_summary), else when no variant beats the SFT control."""
    if report.controls.get("rft"):
        return rft_summary(report)
    sft = report.controls.get("sft")
    versus_sft = [c for c in report.against_controls if c["role"] == "sft"]
    if not sft or not versus_sft or any(c["outcome"] == BEATS for c in versus_sft):
        return None
    if all(c["outcome"] == NO_COMPARISON for c in versus_sft):
        return None   # the control itself has nothing to compare with: the section's lines say why
    one_seed = all(not c["delta"].has_ci for c in versus_sft)
    return (f"**No variant beats the SFT control (`{sft}`) on `{report.metric}`: RL not shown to help here** "
            "(the SFT control imitates the task's gold solutions for the same budget)."
            + (" (One seed: point estimates only, no comparison is possible.)" if one_seed else ""))


def rft_summary(report: Report) -> str | None:
    """Which variants beat the RFT control (the same verifier and sampling, no policy gradient),
    then, framed as imitation, the SFT control where there is one."""
    rft, sft = report.controls["rft"], report.controls.get("sft")
    versus = [c for c in report.against_controls if c["role"] == "rft"]
    if not versus or all(c["outcome"] == NO_COMPARISON for c in versus):
        return None   # the control itself has nothing to compare with: the section's lines say why
    beat = sorted({c["variant"] for c in versus if c["outcome"] == BEATS})
    line = (f"**{', '.join(f'`{v}`' for v in beat)} beat{'s' if len(beat) == 1 else ''} the RFT control (`{rft}`) "
            f"on `{report.metric}`: the policy gradient adds to rejection sampling here**" if beat else
            f"**No variant beats the RFT control (`{rft}`) on `{report.metric}`: the policy gradient not shown "
            "to beat rejection sampling here**")
    line += " (the RFT control trains on the policy's own verified-correct samples, sampled as the RL runs sample)."
    versus_sft = [c for c in report.against_controls if c["role"] == "sft"]
    if sft and versus_sft and not any(c["outcome"] == BEATS for c in versus_sft):
        line += f" No variant beats imitation of the task's gold solutions (`{sft}`, the same budget)."
    if all(not c["delta"].has_ci for c in versus):
        line += " (One seed: point estimates only, no comparison is possible.)"
    return line
