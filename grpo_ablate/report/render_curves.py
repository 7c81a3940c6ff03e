"""The report's curve sections as markdown and JSON: the run summaries side by side, the
compute–performance fits with their split verdicts, and the predicted verdicts."""
from __future__ import annotations

from dataclasses import asdict

from grpo_ablate.report.build import Report
from grpo_ablate.report.fits import CEILING_TOLERANCE, Fit
from grpo_ablate.report.formatting import fmt_estimate, fmt_num
from grpo_ablate.report.scaling import EXCLUSIONS, agreement
from grpo_ablate.report.verdicts import UNDECIDED


def markdown_sections(report: Report) -> list[str]:
    out = []
    if report.summaries:
        out += ["## Run summaries", ""] + summary_lines(report) + [""]
    if report.fits.get("variants") or report.fits.get("why"):
        out += ["## Compute–performance fits", ""] + fit_lines(report) + [""]
    if report.predictions is not None:
        out += ["## Forecast verdicts (not verdicts)", ""] + prediction_lines(report) + [""]
    if report.aggregates.get("contrasts"):
        out += ["## Aggregates (rliable)", ""] + aggregate_lines(report) + [""]
    return out


def aggregate_lines(report: Report) -> list[str]:
    """IQM per variant and P(improvement) per contrast, on the compared summary."""
    a = report.aggregates
    lines = [f"On each run's {report.summary.label} `{report.metric}`: the interquartile mean over seeds (IQM) "
             "and the probability that a run with the trick beats a run without it (Mann–Whitney, unpaired; "
             "0.5 = no difference), with 95% stratified-bootstrap intervals (rliable, Agarwal et al. 2021).", "",
             "| contrast | P(with > without) (95% CI) | IQM with | IQM without |", "|---|---|---|---|"]
    for c in a["contrasts"]:
        p = c["improvement"]
        cell = fmt_num(p.mean) + (f" [{fmt_num(p.low)}, {fmt_num(p.high)}]" if p.has_ci else "")
        iqm = lambda name: fmt_num(a["variants"].get(name).mean if a["variants"].get(name) else None)
        lines.append(f"| {c['trick']} | {cell} | {iqm(c['with'])} | {iqm(c['without'])} |")
    return lines


def summary_lines(report: Report) -> list[str]:
    """Per contrast and summary: Δ, the paired SD, the verdict and, where the report has a reason to
    decide it, the seeds one paired t needs for 80% power at that Δ — which summary would have decided what."""
    labels = [s["summary"] for s in report.summaries]
    chosen = next(s["summary"] for s in report.summaries if s["chosen"]) if any(
        s["chosen"] for s in report.summaries) else report.summary.label
    lines = [f"How a run's curve becomes the number compared: *{chosen}* in this report (`--summary`); only it "
             "decides, the other columns are **exploratory** (a summary picked after seeing them would not be covered "
             "by the error control). Each summary's verdicts on the same runs (the same error control), its paired SD "
             "over seeds, and, where the report has a reason to decide the contrast (`--effect`, or an unadjusted 95% "
             "interval that excludes 0), about how many seeds one paired t at 5% needs for 80% power against that Δ "
             "(`seeds 80%`: post-hoc on a measured Δ, an order of magnitude; — where there is no reason). "
             "final: the last eval; auc: the compute-weighted mean of the curve; best: the best eval; "
             "last_k: the mean of the last k evals.",
             "", "| contrast | " + " | ".join(f"{label}: Δ / SD / verdict / seeds 80%" for label in labels) + " |",
             "|---|" + "---|" * len(labels)]
    for i, v in enumerate(report.verdicts):
        cells = [v["trick"]]
        for s in report.summaries:
            c = s["contrasts"][i]
            needed = c["seeds_needed"]
            cells.append(f"{fmt_num(c['delta'].mean, signed=True)} / {fmt_num(c['sd'])} / {c['verdict']} / "
                         f"{'~' + str(needed) if needed else '—'}")
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    lines.append("| decided | " + " | ".join(f"{s['decided']} of {len(s['contrasts'])}" for s in report.summaries)
                 + " |")
    return lines


def fit_lines(report: Report) -> list[str]:
    f = report.fits
    if not f.get("applicable"):
        return [f"Not fitted: {f.get('why')}."]
    unit = {"tokens": "sampled + trained completion tokens", "steps": "optimizer steps",
            "seconds": "seconds of training steps"}.get(f["unit"], f["unit"])
    lines = [f"ScaleRL's curve R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B) per treatment run against compute "
             f"C ({unit}); R0 is the base eval. A: the ceiling, B: the efficiency (steeper with compute), "
             "C_mid: compute to half the gain. Means ± 95% t-interval over the seeds whose fit is good; a poor "
             "fit (a curve that rises and falls, a flat or falling one, or one whose midpoint lies beyond the "
             f"compute measured) gives no number. A within ±{CEILING_TOLERANCE:g} counts as the same ceiling; B "
             "is compared after refitting both runs of a seed at their mean A (Δ log B), over the seeds whose "
             "rise came after their first eval (before it, any steep curve fits: B is not identified; evaluate "
             "more often).", "",
             "Before A is read, each run is tested for a drift: its peak against the mean of its last third of "
             "evals, in binomial eval SEs (at most 5% of monotone curves are flagged). A run that peaks and falls "
             "is *unstable*: its fit is no ceiling (a monotone curve through a rise and a fall puts A below the "
             "peak). An arm is *unstable* when its runs drift taken together (their drift statistics summed, 5%). "
             "A contrast's fits are withheld — *drifts more* / *drifts less* / *both drift*, or *exclusion differs "
             "by arm* — when an arm is unstable or when the share of fits it could not use differs by arm "
             "(Fisher's exact test, 5%): ΔA over the seeds that fit would then compare selected subsets.", "",
             "| variant | good fits (B identified) | A | B | C_mid (median) | pooled fit | unstable (drift p) "
             "| why not |", "|---|---|---|---|---|---|---|---|"]
    for v in f["variants"]:
        p = v["pooled"]
        pool = (f"A {p.A:.3f}, " + (f"B {p.B:.2f}" if p.B_identified else "B not identified")
                + ("" if p.ok else " (poor)")) if p.A is not None else "—"
        lines.append(f"| {v['variant']} | {v['ok']} of {v['runs']} ({v['B_identified']}) | {fmt_estimate(v['A'])} | "
                     f"{fmt_estimate(v['B'])} | {fmt_num(v['C_mid'], 0) if v['C_mid'] else '—'} | {pool} | "
                     f"{unstable_cell(v)} | {'; '.join(v['poor']) or '—'} |")
    if f["contrasts"]:
        lines += ["", "| contrast | seeds fit on both sides (B identified) | fits not used, with / without "
                  "(Fisher p) | ΔA (95% CI) | Δ log B at a shared A (95% CI) | ceiling | efficiency | split verdict |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in f["contrasts"]:
            undecided = "withheld" if c.get("withheld") else "undecided"
            lines.append(f"| {c['trick']} | {c['both_ok']} of {c['pairs']} ({c.get('B_identified', 0)}) | "
                         f"{exclusion_cell(c)} | {fmt_estimate(c['dA'], signed=True)} | "
                         f"{fmt_estimate(c['dB'], signed=True)} | {c['ceiling'] or undecided} | "
                         f"{c['speed'] or undecided} | **{c['split']}** |")
        lines += [f"- {c['trick']}: withheld, {c['withheld']}." for c in f["contrasts"] if c.get("withheld")]
    return lines


def unstable_cell(v: dict) -> str:
    """Runs flagged as drifting, and whether the arm drifts as a whole (its drift p)."""
    if v.get("drift_p") is None:
        return "—"
    runs = f"{v['excluded']['drifting']} of {v['runs']} runs drift"
    return f"{'**unstable**: ' if v['unstable'] else ''}{runs} (p = {v['drift_p']:.3f})"


def exclusion_cell(c: dict) -> str:
    """Per arm, the fits not used as ceilings by reason (poor fit, drifting), and Fisher's p."""
    side = lambda counts: " + ".join(f"{counts[why]} {why}" for why in EXCLUSIONS if counts[why]) or "0"
    test = f" (p = {c['exclusion_p']:.3f})" if c.get("exclusion_p") is not None else ""
    return f"{side(c['excluded']['with'])} / {side(c['excluded']['without'])}{test}"


def prediction_lines(report: Report) -> list[str]:
    p = report.predictions
    when = (f"from the first {p['fraction']:.0%} of every run's steps" if p["fraction"] is not None
            else f"while {p['running']} run(s) are still running")
    how = ", ".join(f"{n} {k}" for k, n in sorted(p["how"].items()))
    lines = [f"**Forecasts, not verdicts**: the *{report.summary.label}* of every run predicted {when} ({how}): "
             "the rest of each curve is its prefix's fit (a prefix that fits poorly is carried flat at the mean "
             "of its last two evals), and the contrasts are forecast on the predicted numbers by the fixed 95% "
             "rule. The interval adds each run's extrapolation error as far as its prefix shows it (the future "
             "evals' own noise, and the prefix fit's misfit beyond it, or one eval SE for a prefix carried flat) "
             "to the seeds'. An effect that begins after the prefix — a late drift, a late gain — is in no prefix: a "
             "forecast cannot see it, so it is no verdict.", ""]
    measured = any("measured" in c for c in p["contrasts"])
    lines += ["| contrast | forecast Δ (95% CI, with extrapolation error) | forecast (not a verdict) |"
              + (" measured verdict | agrees |" if measured else ""),
              "|---|---|---|" + ("---|---|" if measured else "")]
    for c in p["contrasts"]:
        row = f"| {c['trick']} | {fmt_estimate(c['delta'], signed=True)} | *{c['verdict']}* (forecast) |"
        if measured:
            row += f" {c.get('measured') or '—'} | {'yes' if c.get('measured') == c['verdict'] else 'no'} |"
        lines.append(row)
    if measured:
        lines += ["", agreement_line(agreement(p, report.verdicts, UNDECIDED))]
    return lines


def agreement_line(a: dict) -> str:
    """The forecasts' score, split so that agreeing on *no evidence* does not pass for foresight."""
    (agree, decided), (same, undecided), (covered, shown) = a["decided"], a["undecided"], a["covered"]
    text = (f"Forecasts against the measured verdicts — decided: {agree} of {decided} agree; undecided: {same} of "
            f"{undecided} (a forecast of *no evidence* everywhere scores every undecided one); the measured Δ lies "
            f"inside the forecast interval in {covered} of {shown} contrast(s).")
    return text + (" No contrast was decided by measurement, so this sweep cannot show whether the forecasts "
                   "foresee anything." if decided == 0 else "")


def json_sections(report: Report) -> dict:
    """The same as plain data (no curves or fit objects' methods: their numbers)."""
    fits = report.fits
    variants = [{**{k: v for k, v in row.items() if k not in ("fits", "curves", "pooled")},
                 "pooled": fit_record(row["pooled"]),
                 "runs_fit": {str(k): fit_record(f) for k, f in row["fits"].items()}}
                for row in fits.get("variants", [])]
    predictions = report.predictions
    if predictions is not None and any("measured" in c for c in predictions["contrasts"]):
        predictions = {**predictions, "agreement": agreement(predictions, report.verdicts, UNDECIDED)}
    return {"summary": report.summary.label, "summaries": report.summaries, "aggregates": report.aggregates,
            "fits": {**{k: v for k, v in fits.items() if k != "variants"}, "variants": variants},
            "predictions": predictions}


def fit_record(f: Fit) -> dict:
    """A fit's numbers, its drift test's with them."""
    return {**vars(f), "drift": asdict(f.drift) if f.drift is not None else None}
