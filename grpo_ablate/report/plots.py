"""The report's PNGs: one curve per logged metric (a line per variant: mean over seeds, min–max
shaded, health flags marked), the bar chart of Δ per trick, and the diagnostics' heatmap.

Drawn with matplotlib's object-oriented API (a `Figure` of its own, no pyplot): nothing global
is switched, no display is needed, and no figure outlives its file.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from grpo_ablate.report.build import Report
from grpo_ablate.report.curves import kl_column
from grpo_ablate.report.diagnostics import plot as plot_diagnostics
from grpo_ablate.report.render_boundary import boundary_figure
from grpo_ablate.report.render_transfer import transfer_figure
from grpo_ablate.report.verdicts import VERDICT_COLORS

if TYPE_CHECKING:   # matplotlib is imported where a figure is drawn: --no-figures never pays its ~0.6 s
    from matplotlib.figure import Figure

CURVES = ("reward/mean", "length/mean", "policy/entropy", "kl")  # drawn after the chosen metric
CONTROL_STYLES = {"base": ("dimgray", "--"), "sft": ("black", "-."),   # (colour, dashes) of a control's curve
                  "rft": ("black", ":")}


def plot_figures(report: Report, out_dir: Path) -> list[tuple[str, str]]:
    """Every figure this sweep supports, written into out_dir. Returns (title, file name) pairs."""
    figures = []
    colors, styles = variant_styles(report)
    for column in [report.metric] + [c for c in CURVES if c != report.metric]:
        fig = curve_figure(report, column, colors, styles)
        if fig is not None:   # no run logged this column: no figure
            label = "KL (kl/k3, else kl/k1)" if column == "kl" else column
            figures.append((label, save(fig, out_dir, f"curve_{column.replace('/', '_')}.png")))
    if report.verdicts:
        figures.append(("Δ per trick", save(delta_figure(report), out_dir, "delta.png")))
    fig = boundary_figure(report)
    if fig is not None:
        figures.append(("pass@k against k", save(fig, out_dir, "passk.png")))
    fig = transfer_figure(report)
    if fig is not None:
        figures.append(("Each trick across contexts", save(fig, out_dir, "transfer.png")))
    fig = fits_figure(report, colors)
    if fig is not None:
        figures.append(("Compute–performance fits", save(fig, out_dir, "fits.png")))
    figures += plot_diagnostics(report, out_dir)   # the interaction heatmap, when the sweep has pairs
    return figures


def save(fig: Figure, out_dir: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=110)
    return name


def variant_styles(report: Report) -> tuple[dict, dict]:
    """variant -> colour and variant -> dashes."""
    treatments = [v for v in report.sweep.variants if v.kind != "control"]
    import matplotlib

    tab10 = matplotlib.colormaps["tab10"]
    colors = {v.name: tab10(i % 10) for i, v in enumerate(treatments)}
    # identical variants (a trick that changes nothing) would hide each other: vary the dashes
    styles = {v.name: ("-", "--", ":", "-.")[i % 4] for i, v in enumerate(treatments)}
    # controls are reference lines, not contenders: grey/black, dashed, thinner, drawn underneath
    for v in report.sweep.variants:
        if v.kind == "control":
            colors[v.name], styles[v.name] = CONTROL_STYLES.get(v.control, ("gray", ":"))
    return colors, styles


def variant_curves(report: Report, variant: str, column: str) -> pd.DataFrame:
    """One column per run of the variant that logged `column` ("kl": k3, else k1), indexed by step."""
    series = {}
    for r in report.sweep.runs:
        col = kl_column(r.metrics) if column == "kl" else column
        if r.variant == variant and col in r.metrics:
            points = r.metrics[["step", col]].dropna()
            if len(points):
                series[r.name] = points.set_index("step")[col]
    return pd.DataFrame(series).sort_index() if series else pd.DataFrame()


def curve_figure(report: Report, column: str, colors: dict, styles: dict) -> Figure | None:
    """One metric over steps: a line per variant (mean over seeds), min–max shaded, flags marked."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(7.5, 4.5))
    ax = fig.subplots()
    drawn, flag_marks = False, False
    for v in report.sweep.variants:
        table = variant_curves(report, v.name, column)
        if table.empty:
            continue
        control, color, n = v.kind == "control", colors[v.name], len(table.columns)
        mean = table.mean(axis=1)
        if control:
            ax.plot(mean.index, mean.values, color=color, ls=styles[v.name], lw=1.4, zorder=1.5,
                    label=f"control: {v.control or v.name} (n={n})")
        else:
            ax.plot(mean.index, mean.values, color=color, ls=styles[v.name], lw=1.8,
                    marker="o" if len(mean) <= 40 else None, ms=3, label=f"{v.name} (n={n})")
        if n > 1:
            ax.fill_between(table.index, table.min(axis=1), table.max(axis=1), color=color,
                            alpha=0.08 if control else 0.18, lw=0, zorder=1 if control else None)
        for r in report.sweep.runs:
            for f in r.flags if r.variant == v.name else []:
                y = float(np.interp(f.step, mean.index.to_numpy(float), mean.to_numpy(float)))
                ax.plot([f.step], [y], marker="x" if f.name == "diverged" else "v", ms=9, mew=2,
                        color=color, ls="none")
                flag_marks = True
        drawn = True
    if not drawn:
        return None
    handles, labels = ax.get_legend_handles_labels()
    if flag_marks:
        handles += [Line2D([], [], marker="x", color="k", ls="none", mew=2),
                    Line2D([], [], marker="v", color="k", ls="none")]
        labels += ["diverged", "other health flag"]
    ax.legend(handles, labels, fontsize=8, loc="best")
    label = "KL (kl/k3, else kl/k1)" if column == "kl" else column
    ax.set(xlabel="step", ylabel=label, title=f"{label}: mean over seeds, min–max shaded")
    ax.grid(alpha=0.3)
    return fig


def delta_figure(report: Report) -> Figure:
    """Δ per contrast with its 95% CI, coloured by verdict; a trick with no Δ (e.g. it breaks
    training) gets a labelled empty row."""
    bars = report.verdicts
    counts = Counter(v["trick"] for v in bars)
    labels = [v["trick"] if counts[v["trick"]] == 1 else f"{v['trick']} ({v['with']} vs {v['without']})"
              for v in bars]
    means = np.array([v["delta"].mean if v["delta"].mean is not None else 0.0 for v in bars])
    err = np.array([[v["delta"].mean - v["delta"].low, v["delta"].high - v["delta"].mean]
                    if v["delta"].has_ci else [0.0, 0.0] for v in bars]).T
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 1.2 + 0.45 * len(bars)))
    ax = fig.subplots()
    y = np.arange(len(bars))
    ax.barh(y, means, xerr=err, capsize=4, color=[VERDICT_COLORS[v["verdict"]] for v in bars],
            edgecolor="black", lw=0.5)
    ax.axvline(0.0, color="black", lw=0.8)
    ax.margins(x=0.15)
    ax.set_yticks(y, [f"{label}: {v['verdict']}" for label, v in zip(labels, bars)], fontsize=8)
    for i, v in enumerate(bars):
        if v["delta"].mean is None:
            ax.text(0, i, "  no Δ: no completed runs on one side", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel=f"Δ {report.metric} (with − without)", title="Effect of each trick, 95% CI")
    ax.grid(axis="x", alpha=0.3)
    return fig


def fits_figure(report: Report, colors: dict) -> Figure | None:
    """Each variant's measured points (every seed) against compute, and its pooled fitted curve
    (solid when the fit is good, dotted when poor); None when nothing was fitted."""
    variants = [v for v in report.fits.get("variants", []) if v["curves"]]
    if not variants:
        return None
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.2))
    ax = fig.add_subplot()
    for v in variants:
        color = colors.get(v["variant"], "gray")
        for points in v["curves"].values():
            ax.plot(points.compute, points.values, "o", color=color, alpha=0.35, markersize=3)
        p = v["pooled"]
        if p.A is not None:
            grid = np.linspace(0.0, p.c_max, 200)
            label = f"{v['variant']}: A {p.A:.3f}, " + (f"B {p.B:.2f}" if p.B_identified else "B not identified") + (
                "" if p.ok else " (poor fit)")
            ax.plot(grid, p.at(grid), "-" if p.ok else ":", color=color, label=label)
        else:
            ax.plot([], [], "o", color=color, label=f"{v['variant']}: not fitted")
    unit = report.fits.get("unit")
    ax.set_xlabel({"tokens": "compute (sampled + trained completion tokens)",
                   "seconds": "training wall time (s)"}.get(unit, f"compute ({unit})"))
    ax.set_ylabel(report.metric)
    ax.set_title("Measured points per seed; pooled sigmoid fit per variant (ScaleRL)")
    ax.legend(fontsize=7, loc="lower right")
    return fig
