"""Whether training beat its untrained start, per context (report/training.py): one line above
the verdict table, and the section with each context's numbers, the SFT and RFT controls and advice."""
from __future__ import annotations

from grpo_ablate.report.formatting import fmt_delta, fmt_num, fmt_p
from grpo_ablate.report.verdicts import BEATS, NO_COMPARISON

LABELS = {None: "this sweep"}


def training_line(report) -> str | None:
    """One sentence above the verdict table: per context the decided direction (or not) with its
    adjusted p; None when the sweep has no such test."""
    section = report.training
    if not section:
        return None
    checks = section["contexts"]
    start = "its untrained start" if checks[0]["without"] != "step 0" else "its runs' own step-0 eval (no base control)"
    parts = []
    for c in checks:
        p = c["delta"].p_adjusted if c["delta"].p_adjusted is not None else c["delta"].p
        numbers = f"adjusted p {fmt_p(p)}" if p is not None else c["verdict"]
        parts.append(f"{context_head(c, report.metric)} ({numbers}"
                     + ("; every variant ends below its start" if c["all_worse"] and c["worse"] else "") + ")")
    family = f"{section['family']['label']}, a family apart from the tricks"
    if any(c.get("rft") for c in checks):   # the same verifier without the policy gradient
        start += " and rejection sampling (RFT)"
        family += "; vs RFT: the controls' one-sided family"
        parts = [part + versus_rft(c) for part, c in zip(parts, checks)]
    line = f"**Training vs {start}** ({family}): " + "; ".join(parts) + "."
    if all(c["worse"] for c in checks):
        line += " **Fix the training set-up before comparing tricks.**"
    return line


def training_section(report) -> list[str]:
    """The section below the verdicts: each context's test in full; none when the sweep has no such test."""
    section = report.training
    if not section:
        return []
    family = section["family"]
    checks = section["contexts"]
    first = checks[0]
    per = "one test per context" if first["context"] is not None else "one test"
    against = ("the untrained base (`control-base`: an eval of the context's warm start)"
               if first["without"] != "step 0" else "its runs' own eval at step 0 (no base control)")
    lines = ["## Does training beat its untrained start?", "",
             f"The reference variant against {against}, on the "
             f"{report.summary.label} of `{report.metric}`, {per} ({family['label']}: a family "
             "of its own, apart from the trick contrasts, whose error rate it leaves as stated):"]
    for c in checks:
        lines.append(context_line(c, report.metric))
        if c["advice"]:
            lines.append("  What usually causes this, and what to try (suggestions, not verdicts): "
                         + "; ".join(c["advice"]) + ".")
    worse = [c for c in checks if c["worse"]]
    if worse and len(worse) == len(checks):
        lines.append("**Training lowers the metric everywhere here: fix the training set-up before comparing "
                     "tricks.**")
    elif not worse and all(c["better"] for c in checks):
        lines.append("Training beats its untrained start in every context; the trick verdicts compare ways "
                     "of improving on it.")
    return lines + [""]


def context_head(c: dict, metric: str) -> str:
    """The decided direction, or that there is none, with the metric's move from start to end."""
    where = LABELS.get(c["context"], c["context"])
    move = f"{fmt_num(c['start'])} → {fmt_num(c['end'])}"
    if c["worse"] or c["better"]:
        return f"**training {c['direction']} {metric} in {where}: {move}**"
    return f"**in {where}, training is not shown to change {metric}: {move}** (*{c['verdict']}*)"


def context_line(c: dict, metric: str) -> str:
    """One context: the decided direction (or not), its numbers, the plain statement when every
    variant ended below its start, and the SFT control."""
    head = context_head(c, metric)
    numbers = fmt_delta(c["delta"])
    line = f"- {head} (`{c['with']}` vs `{c['without']}`: {numbers + '; ' if numbers else ''}{c['why']})."
    if c["all_worse"] and c["worse"]:
        line += (" Every variant there ends below its own start: **the trick contrasts there compare ways of "
                 "getting worse.**")
    elif c["all_worse"]:   # plainly said, but not as a finding: the test above did not decide
        drop = sum(c["changes"].values()) / len(c["changes"])
        line += f" Every variant there ends below its own start (by {abs(drop):.3f} on average; not decided)."
    rft = c.get("rft")
    if rft is not None:
        line += f" Against the RFT control: {versus_rft(c).removeprefix(', ')}."
    sft = c.get("sft")
    if sft is not None:
        if sft["outcome"] == BEATS:
            line += f" It beats the SFT control ({fmt_delta(sft['delta'])})."
        elif sft["outcome"] == NO_COMPARISON:
            line += f" No comparison with the SFT control ({sft['why']})."
        else:
            line += f" It does not beat the SFT control ({fmt_delta(sft['delta'])}; {sft['why']})."
    return line


def versus_rft(c: dict) -> str:
    """", vs RFT: ..." of one context's reference (the one-sided test of the controls' family)."""
    rft = c.get("rft")
    if rft is None:
        return ""
    d = rft["delta"]
    numbers = ("" if d.mean is None else f"Δ = {fmt_num(d.mean, signed=True)}"
               + (f" [{fmt_num(d.low, signed=True)}, {fmt_num(d.high, signed=True)}]" if d.has_ci else ""))
    if rft["outcome"] == BEATS:
        return f", **it beats RFT** ({numbers})"
    if rft["outcome"] == NO_COMPARISON:
        return f", no comparison with RFT ({rft['why']})"
    return f", **not shown to beat RFT** ({numbers})"
