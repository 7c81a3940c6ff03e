"""The report's section across contexts (report/transfer.py) as markdown, and its picture:
the trick × context table, the transfer verdicts, the claims beside the measurements (and, for a
sweep in one context, its claims table: report/claims.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from grpo_ablate.report.build import Report
from grpo_ablate.report.claims import AGREES, CONTRADICTS, NOT_TESTED, SAMPLED
from grpo_ablate.report.formatting import fmt_num

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def markdown_section(report: Report) -> list[str]:
    t = report.transfer
    if not t:
        return []
    names = [c["name"] for c in t["contexts"]]
    out = ["## Across contexts", "",
           f"The same matrix in {len(names)} contexts; each trick's contrast is decided in each context as above "
           f"(`<trick>@<context>`). Compared: each run's {report.summary.label} `{report.metric}`.", ""]
    out += [f"- **{c['name']}**: {' '.join(f'`{o}`' for o in c['overrides']) or 'no overrides'}"
            + (f" — {', '.join(f'{k} {v}' for k, v in c['tags'].items())}" if c["tags"] else "")
            for c in t["contexts"]]
    out += ["", "### Trick × context", "",
            "Δ (with − without) [95% CI], *verdict*, per context; the last column reads across them.", "",
            "| trick | " + " | ".join(names) + " | transfer |", "|---|" + "---|" * (len(names) + 1)]
    for trick in t["tricks"]:
        by = {c["context"]: c for c in trick["cells"]}
        cells = [_cell(by[n]) if n in by else "not run here" for n in names]
        out.append(f"| {trick['trick']} | " + " | ".join(cells) + f" | **{trick['transfer']}** |")
    out += ["", "### Transfer verdicts", ""]
    for trick in t["tricks"]:
        p = trick["improvement"]
        prob = (f" P(with > without) over contexts: {fmt_num(p.mean)}"
                + (f" [{fmt_num(p.low)}, {fmt_num(p.high)}]" if p.has_ci else "") + "." if p.mean is not None else "")
        line = f"- **{trick['trick']}**: *{trick['transfer']}* — {trick['why']}.{prob}"
        if trick["to_decide"]:
            line += f" To decide: {trick['to_decide']}."
        out.append(line)
    out += ["", "*holds across the contexts tested*: the same decided direction in every context; *context-dependent*: "
            "the effect differs between two contexts (decided); *sign flips*: it helps in one and hurts in another, "
            "and their difference is decided; *undecided*: none of these. Differences between contexts: Welch's "
            "t-test on the per-seed paired Δs of two contexts, every pair of contexts of every trick one test "
            f"({t['tests']} here), Holm over all of them: the chance of calling any trick of this report "
            f"context-dependent (or a sign flip) when its effect is the same everywhere is ≤ {t['alpha']:.0%}"
            + (" on a fixed set of seeds; after a sequential sweep's looks chose the seeds it holds about 6–7% "
               "(simulated: the looks stop a contrast where its Δs happen to agree). " if report.sweep.sequential
               else ". ") +
            "*inert here* against a decided effect elsewhere, and *breaks training* against *helps*, differ "
            "without a test. P(with > without): rliable's probability of improvement, each context one task "
            "(stratified bootstrap)."]
    if t["claims"]:
        out += ["", "### The papers' claims beside the measurements", "",
                "Per claim of the seed documents (`grpo-ablate tricks`, docs/tricks.md) and context: *agrees*, "
                "*contradicts*, *undecided here* (tested, no decision) or *not tested here* (the claim was made in "
                "another context, or the trick could not act).", "",
                "| trick | claim | where | source | " + " | ".join(names) + " |",
                "|---|---|---|---|" + "---|" * len(names)]
        for row in t["claims"]:
            cells = [row["contexts"].get(n, NOT_TESTED) for n in names]
            out.append(f"| {row['trick']} | *{row['effect']}*: {row['says']} | {row['where'] or 'in general'} | "
                       f"{row['source']} | " + " | ".join(map(_judgement, cells)) + " |")
    elif t["tricks"]:
        out += ["", "No trick of this sweep carries a claim of the seed documents (`grpo-ablate tricks`)."]
    return out + [""]


def _cell(c: dict) -> str:
    d = c["delta"]
    if d.mean is None:
        return f"— *{c['verdict']}*"
    ci = f" [{fmt_num(d.low, signed=True)}, {fmt_num(d.high, signed=True)}]" if d.has_ci else ""
    return f"{fmt_num(d.mean, signed=True)}{ci} *{c['verdict']}*"


def transfer_figure(report: Report) -> Figure | None:
    """Δ with its 95% CI per trick, one marker per context."""
    t = report.transfer
    if not t or not t["tricks"]:
        return None
    names = [c["name"] for c in t["contexts"]]
    markers = "osD^v<>ph*"
    from matplotlib.figure import Figure   # here: a report without figures never imports matplotlib

    fig = Figure(figsize=(7.5, 1.4 + 0.55 * len(t["tricks"])))
    ax = fig.subplots()
    offsets = np.linspace(-0.25, 0.25, len(names)) if len(names) > 1 else [0.0]
    for k, name in enumerate(names):
        ys, xs, lo, hi = [], [], [], []
        for i, trick in enumerate(t["tricks"]):
            cell = next((c for c in trick["cells"] if c["context"] == name), None)
            if cell is None or cell["delta"].mean is None:
                continue
            d = cell["delta"]
            ys.append(i + offsets[k])
            xs.append(d.mean)
            lo.append(d.mean - d.low if d.has_ci else 0.0)
            hi.append(d.high - d.mean if d.has_ci else 0.0)
        ax.errorbar(xs, ys, xerr=[lo, hi], fmt=markers[k % len(markers)], capsize=3, label=name)
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_yticks(range(len(t["tricks"])), [f"{x['trick']}: {x['transfer']}" for x in t["tricks"]], fontsize=8)
    ax.invert_yaxis()
    ax.legend(fontsize=8, title="context", title_fontsize=8)
    ax.set(xlabel=f"Δ {report.metric} (with − without)", title="Each trick in each context, 95% CI")
    ax.grid(axis="x", alpha=0.3)
    return fig


def claims_lines(rows: list[dict]) -> list[str]:
    """A sweep in one context: each claim of a named trick a contrast measured, beside the verdict that
    judges it (report/claims.py)."""
    out = ["Per claim of the seed documents (`grpo-ablate tricks`, docs/tricks.md) on a trick a contrast measured: "
           "*agrees*, *contradicts*, *undecided here* (tested, no decision) or *not tested here* (made in another "
           "context, or the trick could not act). A claim about the *level* is judged by the contrast's verdict above; "
           "one about the *ceiling* by the compute-performance fits' ceiling verdict (*Compute–performance fits*, "
           "below: *raises* / *lowers the ceiling*, or *same ceiling* when ΔA's interval lies within the tolerance).",
           "", "| contrast | trick | claim | measure | source | measured | judged |", "|---|---|---|---|---|---|---|"]
    if any(r["measure"] in SAMPLED for r in rows):
        out[0] += (" One about *pass@k* or *avg@k* by the trick's verdict on pass@n or avg@n at the final eval of "
                   "n samples per problem, a family of its own (*The reasoning boundary*, below; the verdicts above "
                   "where they are on the final avg@n), and *not tested here* under a greedy eval.")
    for r in rows:
        where = f" ({r['where']})" if r["where"] else ""
        out.append(f"| {r['contrast']} | {r['trick']} | *{r['effect']}*{where}: {r['says']} | {r['measure']} | "
                   f"{r['source']} | {r['measured'] or 'no verdict'} | {_judgement(r['judged'])} |")
    return out


def _judgement(judged: str) -> str:
    """A claim's judgement as a cell: bold where the measurement decided it (agrees, contradicts)."""
    return f"**{judged}**" if judged in (AGREES, CONTRADICTS) else judged
