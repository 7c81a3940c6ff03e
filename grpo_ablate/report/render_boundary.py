"""The reasoning-boundary section (report/boundary.py) as markdown, and its picture: pass@k against k
for every arm and the base, on a log axis."""
from __future__ import annotations

from typing import TYPE_CHECKING

from grpo_ablate.report.boundary import START
from grpo_ablate.report.build import Report
from grpo_ablate.report.formatting import fmt_num, fmt_p
from grpo_ablate.report.verdicts import UNDECIDED

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def shown_ks(n: int) -> list[int]:
    """The k of the table: 1, 2, 4, ... and n."""
    return sorted({*(2 ** i for i in range(n.bit_length()) if 2 ** i <= n), n})


def markdown_section(report: Report) -> list[str]:
    b = report.boundary
    if not b:
        return []
    n, against = b["k"], b["against"]
    base = "each seed's start (its step-0 eval: the sweep has no base control)" if against == START \
        else f"the untrained base (`{against}`)"
    fam = b["family"]
    out = ["## The reasoning boundary: pass@k", "",
           f"Does training widen what the policy solves in {n} tries, or only sharpen what it already could? Each "
           f"arm's pass@k at its final eval ({report.eval.describe()}), mean over seeds, k up to the {n} samples drawn "
           "(Chen et al.'s unbiased estimator); beside it " + base + ". *narrows* / *widens*: the arm's pass@"
           f"{n} decided below / above the base's — a paired t per arm"
           + (f", {fam['label']} over the {len(b['arms'])} arms, a family of its own" if fam else "") + ".", ""]
    ks = shown_ks(n)
    out += ["| arm | " + " | ".join(f"pass@{k}" for k in ks) + f" | Δ pass@{n} vs base [95% CI] | adjusted p | "
            "verdict |", "|---|" + "---|" * (len(ks) + 3)]
    arms = {a["with"]: a for a in b["arms"]}
    for name, curve in b["curves"].items():
        arm = arms.get(name)
        d = arm["delta"] if arm else None
        delta = "—" if d is None or d.mean is None else fmt_num(d.mean, signed=True) + (
            f" [{fmt_num(d.low, signed=True)}, {fmt_num(d.high, signed=True)}]" if d.has_ci else " (no CI)")
        p = "—" if d is None else fmt_p(d.p_adjusted if d.p_adjusted is not None else d.p)
        verdict = "base" if name == against else (f"**{arm['verdict']}**" if arm and arm["verdict"] not in UNDECIDED
                                                  else arm["verdict"] if arm else "—")
        cells = [name, *(fmt_num(curve.get(k)) for k in ks), delta, p, verdict]
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    if b["tricks"]:
        fam = b["tricks_family"]
        out += ["", f"Per trick on pass@{n} (with − without), its own family"
                + (f" ({fam['label']}; {fam['model']})" if fam else "") + ": what a claim about pass@k is judged by.",
                "", f"| trick | Δ pass@{n} [95% CI] | adjusted p | verdict |", "|---|---|---|---|"]
        for t in b["tricks"]:
            d = t["delta"]
            delta = "—" if d.mean is None else fmt_num(d.mean, signed=True) + (
                f" [{fmt_num(d.low, signed=True)}, {fmt_num(d.high, signed=True)}]" if d.has_ci else " (no CI)")
            verdict = f"**{t['verdict']}**" if t["verdict"] not in UNDECIDED else t["verdict"]
            out.append(f"| {t['trick']} | {delta} | {fmt_p(d.p_adjusted if d.p_adjusted is not None else d.p)} | "
                       f"{verdict} |")
    return out + [""]


def boundary_figure(report: Report) -> Figure | None:
    """pass@k against k (log axis) for every arm, the base dashed."""
    b = report.boundary
    if not b or not b["curves"]:
        return None
    from matplotlib.figure import Figure   # here: a report without figures never imports matplotlib

    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.subplots()
    for name, curve in b["curves"].items():
        ks = [k for k, v in sorted(curve.items()) if v is not None]
        base = name == b["against"]
        ax.plot(ks, [curve[k] for k in ks], color="dimgray" if base else None, ls="--" if base else "-",
                marker="o" if len(ks) <= 16 else None, ms=3, lw=1.4 if base else 1.8,
                label=f"{name} (base)" if base else name)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="k (samples per problem)", ylabel="pass@k",
           title=f"pass@k at the final eval, mean over seeds ({report.eval.name})")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    return fig


def boundary_json(report: Report) -> dict:
    return {"boundary": report.boundary} if report.boundary else {}
