"""A `Report` as text: report.md (tables, verdicts, controls, diagnostics, health flags, runs),
report.csv (the variants table, one number per cell), report.json (everything), and stdout."""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict

import numpy as np
import pandas as pd

from grpo_ablate.report.build import Report
from grpo_ablate.report.curves import Summary, final_value
from grpo_ablate.report.diagnostics import markdown_sections as diagnostics_sections
from grpo_ablate.report.formatting import fmt_delta, fmt_estimate, fmt_num, fmt_p, fmt_sig
from grpo_ablate.report.health import BREAKING_FLAGS, OPTIONAL_FLAGS, WARNING_FLAGS, shown_thresholds
from grpo_ablate.report.load import CONTROL_COLUMNS, CONTROL_LABELS
from grpo_ablate.report.placebo import section_lines as placebo_lines
from grpo_ablate.report.power import sequential_guarantee
from grpo_ablate.report.render_curves import json_sections, markdown_sections as curve_sections
from grpo_ablate.report.render_boundary import boundary_json, markdown_section as boundary_section
from grpo_ablate.report.render_head import controls_summary, cost_lines, family, head_lines
from grpo_ablate.report.render_training import training_section
from grpo_ablate.report.render_transfer import claims_lines, markdown_section as transfer_section
from grpo_ablate.report.verdicts import BEATS, BREAKS_TRAINING, NOT_SHOWN
from grpo_ablate.stats.error_control import ERROR_CONTROL
from grpo_ablate.stats.intervals import Estimate

STATES = ("completed", "diverged", "failed", "running", "missing")   # a run's states, in table order
AUC = Summary("auc")


def render_stdout(report: Report, fmt: str) -> str:
    if fmt == "csv":
        return flat_rows(report).to_csv(index=False)
    if fmt == "json":
        return json.dumps(report_json(report), indent=2)
    return render_markdown(report, figures=None)


# --------------------------------------------------------------------------- report.md
def render_markdown(report: Report, figures: list[tuple[str, str]] | None = None) -> str:
    """report.md; `figures` are (title, file name next to report.md); None leaves them out. The
    verdicts come first (render_head.py); how to read them, below them."""
    out = head_lines(report)
    if report.verdicts:
        out += ["## Verdicts per trick", ""] + verdict_lines(report) + [""]
    if report.placebo:
        out += ["## A/A check", ""] + placebo_lines(report.placebo, report.metric) + [""]
    if report.claims:
        out += ["## The papers' claims beside the measurements", ""] + claims_lines(report.claims) + [""]
    out += training_section(report)
    out += boundary_section(report)
    out += ["## Variants", "", variants_table(report), "", "## How to read this", ""] + method_lines(report)
    if report.transfer:
        out += [""] + transfer_section(report)
    checks = [v for v in report.verdicts if "expected" in v]
    if checks:
        out += ["", "## Known answers", ""] + known_answer_lines(checks)
    if report.verdicts and all(v["delta"].n <= 1 for v in report.verdicts):
        out += ["", "With one seed per variant no verdict is possible: a run that broke is counted, not tested."]
    if report.verdicts:
        out += ["", "## Power", ""] + cost_lines(report) + power_lines(report)
        noise = eval_noise_lines(report)
        if noise:
            out += ["", "## Eval noise", ""] + noise
    if report.controls:
        out += ["", "## Against the controls", ""] + control_lines(report)
    out += [""] + curve_sections(report)
    out += diagnostics_sections(report)
    out += health_lines(report)
    out += ["", "## Runs", "", runs_table(report), ""]
    if figures is not None:
        out += ["## Figures", "", "Lines: mean over a variant's seeds; shaded: min–max over seeds; "
                "markers: the step a health flag first fired (x = diverged).", ""]
        out += [f"![{t}]({name})" for t, name in figures] or ["No figures: no run logged anything to draw."]
        out.append("")
    return "\n".join(out)


def method_lines(report: Report) -> list[str]:
    """The sweep's facts, how the verdicts were decided, how to read the numbers, and what is missing."""
    s = report.sweep
    states = Counter(r.state for r in s.runs)
    facts = [f"mode {s.mode}" if s.mode else None, f"base {s.base}" if s.base else None,
             f"seeds {', '.join(map(str, s.seeds))}" if s.seeds else None,
             f"{len(s.runs)} runs: " + ", ".join(f"{n} {k}" for k, n in states.most_common())]
    decided = decided_how(report)
    out = ["; ".join(f for f in facts if f) + ".", "", *([decided, ""] if decided else []), numbers_paragraph(report)]
    if not s.manifest_found or any(r.notes for r in s.runs) or s.notes:
        out += ["", "**What is missing or odd**", ""]
        out += [f"- {n}" for n in s.notes]
        out += [f"- `{r.name}`: {'; '.join(r.notes)}" for r in s.runs if r.notes]
    return out


def decided_how(report: Report) -> str | None:
    """The verdicts' error control in full (the line above the verdict table says it in short),
    and why they are exploratory or not the sweep's sequential looks, when they are."""
    p = report.power
    if not p.get("contrasts"):
        return None
    fam = family(report)
    if p["sequential"]:
        how = (f"sequential: {p['looks']} look(s) up to {p['max_seeds']} seeds, stopped: "
               f"{p.get('stopped') or 'not yet'}; " + sequential_guarantee(report.sweep.sequential))
    elif fam:
        level = f"{100 * fam['alpha']:g}%"
        # Holm's and BH's guarantees hold for exact p-values; the blocked model's are approximations,
        # whose rate is what the simulations measured
        measured = (f"about {level} in simulation (docs/statistics.md, \"The blocked model\": the rate per "
                    "scenario; the blocked model's p-values are approximate)")
        modelled = bool(fam.get("modelled"))
        how = f"{p['contrasts']} contrasts, {fam['label']}: " + {
            "holm": "the chance of any false *helps*, *hurts* or *breaks training* in this report "
                    + (f"is {measured}" if modelled else f"≤ {level}"),
            "bh": "false calls " + (f"{measured} of those made" if modelled
                                    else f"≤ {level} of those made, on average"),
            "none": f"each contrast at {level} on its own; none for the report as a whole"}.get(
                fam["method"], f"the family's error rate ≤ {level}")
        how += f"; {fam['model']}" if fam.get("model") else ""
    else:
        how = "fixed 95% intervals"
    line = f"**The verdicts**: {how}."
    if p.get("note"):
        line += f" Note: {p['note']}."
    if report.exploratory:
        line += f" **Exploratory**: {report.exploratory}."
    return line


def numbers_paragraph(report: Report) -> str:
    """What each column and Δ is, how the intervals were computed, and what the controls are."""
    direction = "higher" if report.higher_is_better else "lower"
    return (f"Metric: `{report.metric}` ({direction} is better). Final = the last value a run logged; "
            "a variant's numbers are means over its completed runs, ± the half-width of the 95% "
            "t-interval over seeds. AUC = the metric averaged over its curve (trapezoid over compute: "
            + ("sampled + trained tokens" if report.compute == "tokens"
               else "the training steps' seconds, --compute wall")
            + "; over steps where a run logged none). "
            + ("" if report.summary.how == "final" else
               f"**Compared: each run's {report.summary.label}** ({report.summary.describe()}): Δ, verdicts and "
               "the controls' comparisons are on it. ")
            + interval_words(report)
            + noise_basis(report)
            + "length, truncated, entropy, KL = last logged `length/mean`, `length/truncated_frac`, "
            "`policy/entropy`, `kl/k3` (else `kl/k1`); wall s = status.json's wall time."
            + (" Controls: " + ", ".join(f"`{name}` ({CONTROL_LABELS[role]})" for role, name in report.controls.items())
               + "; " + " and ".join(f"{CONTROL_COLUMNS[role]} = variant − `{name}`"
                                     for role, name in report.controls.items())
               + ", the same way; controls take part in no trick verdict." if report.controls else ""))


def inference_json(report: Report) -> dict:
    """How the report decided: the summary and whether the sweep fixed it, the error control, the
    grid, what the intervals count, and the compute axis."""
    e = report.evidence
    return {"summary": report.summary.label, "fixed_in_manifest": report.sweep.decides_on,
            "exploratory": report.exploratory, "error_control": e.method if e else None,
            "alpha": e.alpha if e else None, "granularity": e.granularity if e else None,
            "intervals_count": "seeds x problems" if e is not None and e.scores else "seeds",
            "why_seeds_only": e.why_no_scores if e else None, "compute": report.compute,
            "test": e.test if e else None, "sensitivity": report.sensitivity}


def noise_basis(report: Report) -> str:
    """What the intervals count: seeds and eval problems, or seeds only and why."""
    e = report.evidence
    if e is not None and e.scores:
        problems = len(next(iter(next(iter(e.scores.values())).values())))
        return f"Intervals count seeds × {problems} eval problems (evals.jsonl; see Eval noise). "
    if e is not None and e.why_no_scores:
        return f"Intervals count seeds only: {e.why_no_scores}. "
    return ""


def level_words(fam: dict) -> str:
    """The level an open contrast's test must beat, and why: "at 0.01, the level Holm's step-down leaves
    the next decision (6 tests, Holm, 5%)"."""
    by = {"holm": "Holm's step-down", "bh": "Benjamini–Hochberg"}.get(fam["method"])
    return (f"at {fmt_p(fam['open_level'])}, the level {by} leaves the next decision ({fam['label']})" if by else
            f"at {fmt_p(fam['open_level'])} ({fam['label']})")


def interval_words(report: Report) -> str:
    """What Δ and its interval are: the model that made them (the blocked model's for a star's contrasts,
    a paired t's for the others)."""
    fam = family(report)
    paired = ("a paired t's on the seeds both sides completed (a seed missing on one side is dropped and named; "
              "Welch only when they share none)")
    if fam and fam.get("modelled"):
        how = ("the 95% CIs of the contrasts the blocked model tests (their basis says `blocked`) are that model's "
               "(its variances from every arm of the star: the line above the verdict table, docs/statistics.md), "
               f"the others {paired}")
    else:
        how = f"the 95% CIs are {paired}"
    return (f"Δ = variant − reference, its mean over the seeds both sides completed; {how}; all unadjusted, the "
            "verdicts use p-values adjusted over the report's family (the first line above the verdict table). ")


def power_lines(report: Report) -> list[str]:
    """Per contrast: seeds, the look that decided it, and for an open one what the report's own test
    could detect and, where the report has a reason to decide it, what that would take."""
    p = report.power
    fam = family(report)
    if p["sequential"]:
        level, se_col = "the sequential boundary of its last look", "paired SD"
    else:
        test = "the blocked model's t-test (or the paired t's, as its basis says)" if fam and fam.get("modelled") \
            else "its paired t-test"
        level = f"{test} {level_words(fam)}" if fam and fam.get("open_level") else test
        se_col = "SE of Δ (its test)"
    target = f"the effect named with --effect ({p['effect']:g})" if p.get("effect") is not None else \
        "the observed |Δ| of a contrast whose unadjusted 95% CI excludes 0 (post-hoc)"
    lines = [f"Seeds: seeds with both sides completed. For an open contrast, *detectable*: the smallest |Δ| these "
             f"seeds detect with 80% power by the test this report runs on it: {level}; *seeds needed*: about how "
             f"many seeds that test needs for 80% power against {target}; a contrast the report has no reason to "
             "decide (its interval spans 0) gets no price. Both rest on a variance from a few seeds: read them as "
             "an order of magnitude, not a plan.", "",
             f"| contrast | verdict | seeds | decided at look | Δ | {se_col} | detectable (80%) | seeds needed |",
             "|---|---|---|---|---|---|---|---|"]
    for v in report.verdicts:
        w = v["power"]
        open_ = w.get("look") is None
        needed = w.get("seeds_needed")
        spread = w.get("sd") if p["sequential"] else w.get("se")
        cells = [v["trick"], v["verdict"], str(w["seeds"]), str(w.get("look") or "—"),
                 fmt_num(v["delta"].mean, signed=True), fmt_num(spread),
                 fmt_num(w.get("detectable_effect")) if open_ else "—",
                 ("—" if not open_ else f"~{needed}" if needed else "—")]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return lines


def eval_noise_lines(report: Report) -> list[str]:
    """How much of each contrast's uncertainty is the eval set's (stats/intervals.py, EvalNoise)."""
    rows = [(v, v["delta"].eval_noise) for v in report.verdicts if v["delta"].eval_noise is not None]
    if not rows:
        return []
    problems = rows[0][1].problems
    lines = [f"Every run is scored on the same {problems} problems. *eval share*: the part of the seed-to-seed "
             "variance of Δ that comes from scoring each run on a sample of problems (each trained policy gets its "
             "own subset right: the seed × problem term, which a larger eval set shrinks); the rest is how "
             "differently the seeds trained. *SE, "
             "seeds only*: what the paired t-test over seeds alone sees, the inference about these problems; "
             "*SE*: with the variance of which problems were drawn added, the inference about the task (the "
             f"intervals above); *SE at 2× / 4×*: the same seeds on a {2 * problems}- / {4 * problems}-problem "
             "eval set (`task.eval_size`).", "",
             "| contrast | eval share | SE, seeds only | SE | SE at 2× | SE at 4× |", "|---|---|---|---|---|---|"]
    samples = any(e.sampling_share is not None for _, e in rows)
    if samples:   # n >= 2 samples per problem: how much of the noise is their draw (the within-problem term)
        lines[0] += (f" *samples' share*: the part of the seed-to-seed variance of Δ that is the draw of the "
                     f"{report.eval.protocol.samples} samples per problem (paired sample by sample, as both arms drew "
                     "them with the same random numbers); *SE at 2× / 4× samples*: the same seeds and problems, "
                     "more samples per problem (`eval.samples`).")
        lines[2] += " samples' share | SE at 2× samples | SE at 4× samples |"
        lines[3] += "---|---|---|"
    for v, e in rows:
        share = fmt_num(100 * e.share, 0) + "%" * math.isfinite(e.share)     # — where a number is missing
        line = f"| {v['trick']} | {share} | " + " | ".join(fmt_num(x, 4) for x in (e.se_seeds, e.se, e.se_at[2],
                                                                                    e.se_at[4])) + " |"
        if samples:
            drawn = "—" if e.sampling_share is None else fmt_num(100 * e.sampling_share, 0) + "%"
            line += f" {drawn} | {fmt_num(e.se_at_samples.get(2), 4)} | {fmt_num(e.se_at_samples.get(4), 4)} |"
        lines.append(line)
    return lines


def health_lines(report: Report) -> list[str]:
    out = ["## Health flags", ""]
    flagged = [(r, f) for r in report.sweep.runs for f in r.flags]
    if flagged:
        out += ["| run | flag | first step | detail |", "|---|---|---|---|"]
        out += [f"| {r.name} | {f.name} | {f.step} | {f.detail.replace('|', '/')} |" for r, f in flagged]
    else:
        out.append("No flag fired.")
    shown = shown_thresholds(report.thresholds, report.sweep.runs)
    logged = {column for r in report.sweep.runs for column in r.metrics.columns}
    named = [f for f in WARNING_FLAGS if f not in OPTIONAL_FLAGS or OPTIONAL_FLAGS[f] in logged]   # can fire here
    named = [", ".join(named[:-1]), named[-1]] if len(named) > 2 else named
    warnings = f"{' and '.join(named)} {'are warnings' if len(named) > 1 else 'is a warning'}"
    out += ["", "Thresholds: " + ", ".join(f"{k}={v}" for k, v in shown.items())
            + f". Breaking flags (for *{BREAKS_TRAINING}*): {', '.join(BREAKING_FLAGS)}; {warnings}."]
    return out


def verdict_lines(report: Report) -> list[str]:
    if not report.verdicts:
        return ["No contrasts: this sweep has no pair of variants that differ by one trick."]
    lines = []
    for v in report.verdicts:
        d = v["delta"]
        numbers = ""
        if d.mean is not None:
            numbers = f"Δ {compared(report)} ({v['with']} − {v['without']}) = {fmt_num(d.mean, signed=True)}"
            if d.has_ci:
                numbers += f", 95% CI [{fmt_num(d.low, signed=True)}, {fmt_num(d.high, signed=True)}]"
            numbers += f", {d.basis}; "
        lines.append(f"- **{v['trick']}**: *{v['verdict']}* — {numbers}{v['why']}.")
    return lines


def compared(report: Report) -> str:
    """What a Δ is of: the metric, or the summary of it when that is not the final value."""
    return report.metric if report.summary.how == "final" else f"{report.summary.label} {report.metric}"


def known_answer_lines(checks: list[dict]) -> list[str]:
    """The sweep file's known-answer variants: the verdict the report gave against the one a
    correct report gives; a wrong one means the report (or the calibration), not the trick, is off."""
    right = sum(v["as_expected"] for v in checks)
    lines = [f"**{right} of {len(checks)} known answers right**" + ("." if right == len(checks) else
             ": a wrong known answer means the report or its calibration is wrong, not the trick."), ""]
    for v in checks:
        mark = "right" if v["as_expected"] else "WRONG"
        lines.append(f"- {v['trick']}: *{v['verdict']}*, expected *{' or '.join(v['expected'])}*: {mark}")
    return lines


# what not beating the decisive control says (control_lines)
NOT_SHOWN_BEYOND = {"sft": "RL not shown to help here",
                    "rft": "the policy gradient not shown to beat rejection sampling here"}
RFT_MEANS = (" The RFT control samples as the RL runs do (prompts, group size, sampler, steps) and trains on "
             "the completions the verifier accepts: not beating it says the policy-gradient machinery did no "
             "better than filtering the policy's own samples.")


def control_lines(report: Report) -> list[str]:
    """The "Against the controls" section: for every treatment, does it beat each control?
    Not beating the strongest control without the policy gradient is said plainly: RFT where the
    sweep has it (the same verifier, no policy gradient), else SFT (imitation of gold solutions)."""
    direction = "above" if report.higher_is_better else "below"
    family = next((c["family"] for c in report.against_controls if c.get("family")), None)
    rule = (f"the one-sided test of Δ {direction} zero rejects at {50 * family['alpha']:g}% after "
            f"{ERROR_CONTROL[family['method']]}'s adjustment over these {family['tests']} comparisons (a family of "
            "its own, apart from the trick contrasts)"
            if family and family["method"] != "none" else f"the 95% CI of Δ lies entirely {direction} zero")
    summary = controls_summary(report)
    lines = [*([summary, ""] if summary else []),
             f"Δ = variant − control on the {report.summary.label} `{report.metric}`, paired on the seeds both "
             f"completed. A variant *beats* a control only when {rule}. The SFT control trains on the task's "
             "gold solutions: not beating it says RL did no better than imitation with those, not that RL "
             "fails." + (RFT_MEANS if "rft" in report.controls else ""), ""]
    by_variant: dict[str, list] = {}
    for c in report.against_controls:
        by_variant.setdefault(c["variant"], []).append(c)
    decisive = "rft" if "rft" in report.controls else "sft"   # not beating it: RL not shown to help
    for variant, comparisons in by_variant.items():
        parts, rl_not_shown = [], False
        for c in comparisons:
            label = CONTROL_LABELS[c["role"]]
            numbers = fmt_delta(c["delta"])
            if c["outcome"] == BEATS:
                parts.append(f"beats {label} ({numbers})")
            elif c["outcome"] == NOT_SHOWN:
                verb = "not shown to beat the untrained base" if c["role"] == "base" else f"does not beat {label}"
                parts.append(f"{verb} ({numbers + '; ' if numbers else ''}{c['why']})")
                rl_not_shown |= c["role"] == decisive
            else:   # the control has nothing to compare with: no claim either way
                parts.append(f"no comparison with {label} ({c['why']})")
        line = f"- **{variant}**: " + "; ".join(parts)
        lines.append(line + (f" — **{NOT_SHOWN_BEYOND[decisive]}**." if rl_not_shown else "."))
    for role in ("sft", "rft"):   # is the control's training budget itself worth anything?
        for where, row in control_rows(report, role):
            numbers = fmt_delta(row["delta_vs_base"])
            lines.append(f"- The {role.upper()} control itself vs the untrained base{where}: "
                         f"{numbers or 'no Δ (no completed runs on a side)'}.")
    if report.against_controls and all(c["delta"].n <= 1 and not c["delta"].has_ci for c in report.against_controls):
        lines += ["", "With one seed per variant no comparison with the controls is possible beyond point estimates."]
    return lines


def control_rows(report: Report, role: str) -> list[tuple[str, dict]]:
    """(" in <context>" or "", the `role` control's row) wherever the sweep has it and the base control."""
    s = report.sweep
    pairs = ([(f" in {ctx}", by_role) for ctx, by_role in s.context_controls.items()] if s.context_controls
             else [("", report.controls)])
    rows = {r["variant"]: r for r in report.rows}
    return [(where, rows[by_role[role]]) for where, by_role in pairs
            if by_role.get("base") and by_role.get(role) in rows]


# --------------------------------------------------------------------------- tables
def variants_table(report: Report) -> str:
    m = report.metric
    extra = [f"{report.summary.label} {m} (compared)"] if any("summary" in row for row in report.rows) else []
    header = ["variant", "tricks on", "seeds", "status", f"final {m} (95% CI)", f"AUC {m}", *extra, "Δ vs reference",
              *(CONTROL_COLUMNS[role] for role in report.controls),
              "length", "truncated", "entropy", "KL", "wall s", "flags"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in report.rows:
        name = row["variant"] + (" (control)" if row["kind"] == "control" else "")
        delta = "reference" if row["reference"] is None and any(r["reference"] == row["variant"] for r in report.rows) \
            else ("—" if row["reference"] is None or row["delta"].mean is None
                  else f"{fmt_estimate(row['delta'], signed=True)} vs {row['reference']}")
        versus = ["control" if control == row["variant"] else fmt_estimate(row[f"delta_vs_{role}"], signed=True)
                  for role, control in report.controls.items()]
        cells = [name, tricks_cell(row), ",".join(map(str, row["seeds"])) or "—",
                 status_cell(row), fmt_estimate(row["final"]), fmt_estimate(row["auc"]),
                 *([fmt_estimate(row.get("summary"))] if extra else []), delta, *versus,
                 fmt_num(row["length"], 1), fmt_num(row["truncated"], 2), fmt_num(row["entropy"]), fmt_sig(row["kl"]),
                 fmt_num(row["wall_time_s"], 1),
                 ", ".join(f"{k}×{n}" for k, n in sorted(row["flags"].items())) or "—"]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


def status_cell(row: dict) -> str:
    """How many runs are in each state, with the steps where they diverged or are running."""
    parts = []
    for state in STATES:
        n = row["status"].get(state, 0)
        if not n:
            continue
        if state == "diverged":
            parts.append(f"{n} diverged@{','.join(str(s) for s in row['diverged_steps'])}")
        elif state == "running":
            parts.append(f"{n} running@{','.join(str(s) for s in row['running_steps'])}")
        else:
            parts.append(f"{n} {state}")
    parts += [f"{n} {state}" for state, n in row["status"].items() if state not in STATES]
    return ", ".join(parts) or "no runs"


def tricks_cell(row: dict) -> str:
    """A control has no tricks to list: say what it is instead."""
    if row["kind"] != "control":
        return ", ".join(row["tricks_on"]) or "—"
    what = {"base": "no training", "sft": "supervised on reference solutions",
            "rft": "supervised on its own verified-correct samples"}.get(row.get("control"),
                                                                                 f"control {row.get('control')}")
    return what + (f", {row['budget']} budget" if row.get("budget") and row.get("control") != "base" else "")


def runs_table(report: Report) -> str:
    lines = ["| run | variant | seed | state | step | " + f"final {report.metric} | AUC | flags | notes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report.sweep.runs:
        flags = ", ".join(f"{f.name}@{f.step}" for f in r.flags) or "—"
        notes = "; ".join(r.notes + ([f"reason: {r.reason}"] if r.reason else [])) or "—"
        cells = [r.name, r.variant, str(r.seed), r.state, str(r.step if r.step is not None else "—"),
                 fmt_num(final_value(r.metrics, report.metric)), fmt_num(AUC(r.metrics, report.metric)),
                 flags, notes]
        lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- report.csv, report.json
def flat_rows(report: Report) -> pd.DataFrame:
    """The variants table with one number per cell: report.csv and the W&B table."""
    records = []
    for row in report.rows:
        rec = {"variant": row["variant"], "kind": row["kind"], "tricks_on": ";".join(row["tricks_on"]),
               "seeds": ";".join(map(str, row["seeds"])), "reference": row["reference"], "metric": report.metric}
        for state in STATES:
            rec[f"n_{state}"] = row["status"].get(state, 0)
        rec["diverged_steps"] = ";".join(map(str, row["diverged_steps"]))
        for name in ("final", "auc", *(["summary"] if "summary" in row else []), "delta"):
            est = row[name] or Estimate()
            rec.update({f"{name}_mean": est.mean, f"{name}_ci_low": est.low, f"{name}_ci_high": est.high,
                        f"{name}_n": est.n})
        for role in report.controls:   # columns only when the sweep has that control
            est = row[f"delta_vs_{role}"] or Estimate()
            rec.update({f"delta_vs_{role}": est.mean, f"delta_vs_{role}_ci_low": est.low,
                        f"delta_vs_{role}_ci_high": est.high, f"delta_vs_{role}_n": est.n,
                        f"beats_{role}": row.get(f"beats_{role}")})
        rec.update({k: row[k] for k in ("length", "truncated", "entropy", "kl", "wall_time_s")})
        rec["flags"] = ";".join(f"{k}:{n}" for k, n in sorted(row["flags"].items()))
        records.append(rec)
    return pd.DataFrame(records)


def plain(value):
    """JSON-ready: estimates as dicts, numpy scalars as Python numbers, NaN/Inf as null."""
    if isinstance(value, Estimate):
        return plain(asdict(value))
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (np.integer, np.floating)):
        return plain(value.item())
    return value


def report_json(report: Report, figures: list[tuple[str, str]] | None = None) -> dict:
    s = report.sweep
    return plain({
        "sweep": {"dir": str(s.dir), "name": s.name, "sweep_id": s.sweep_id, "mode": s.mode, "base": s.base,
                  "seeds": s.seeds, "wandb_group": s.wandb_group, "manifest_found": s.manifest_found,
                  "notes": s.notes},
        "metric": report.metric, "higher_is_better": report.higher_is_better,
        "thresholds": shown_thresholds(report.thresholds, report.sweep.runs),
        "variants": report.rows, "verdicts": report.verdicts, "power": report.power,
        **({"controls": report.controls, "against_controls": report.against_controls} if report.controls else {}),
        **({"context_controls": s.context_controls} if s.context_controls else {}),
        "runs": [{"run_dir": r.name, "variant": r.variant, "seed": r.seed, "state": r.state, "step": r.step,
                  "reason": r.reason, "wall_time_s": r.wall_time_s, "final": final_value(r.metrics, report.metric),
                  "auc": AUC(r.metrics, report.metric), "flags": [asdict(f) for f in r.flags],
                  "notes": r.notes} for r in s.runs],
        "figures": [name for _, name in figures or []],
        "inference": inference_json(report),
        "diagnostics": report.diagnostics,
        **({"transfer": report.transfer} if report.transfer else {}),
        **({"training": report.training} if report.training else {}),
        **({"placebo": report.placebo} if report.placebo else {}),
        **({"claims": report.claims} if report.claims else {}),
        **({"eval": {"name": report.eval.name, "protocol": report.eval.protocol.settings(),
                     "after_training": report.eval.after_training, "steps": list(report.eval.steps)}}
           if report.eval and (report.eval.after_training or not report.eval.protocol.greedy) else {}),
        **boundary_json(report),
        **json_sections(report),
    })
