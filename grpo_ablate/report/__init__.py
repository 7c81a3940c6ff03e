"""`grpo-ablate report`: which tricks matter — the table, verdicts, health flags, pictures.

Reads only files: the sweep's `manifest.json` and, per run dir, `metrics.jsonl`,
`samples.jsonl`, `status.json` and `config.yaml`. No torch, no network, no W&B unless asked,
so it works on a laptop that holds nothing but a copied sweep dir.

Statistics are over seeds: a run's number is a summary of its curve (`--summary`: the last
value it logged by default; curves.py), a variant's is the mean over its *completed* runs
with a 95% t-interval; a trick's effect is
Δ = metric(with) − metric(without), paired by seed when both sides have the same seeds,
otherwise Welch's interval. Diverged runs are not averaged in (their last value predates the
blow-up); they are counted, flagged, drawn, and decide the *breaks training* verdict.
Control runs (the untrained base, the SFT control) are rows and reference curves, and every
variant's Δ against each is given the same way; they take part in no trick verdict.

    load.py             the sweep dir: manifest, run dirs, controls, contrasts (Run, Sweep)
    curves.py           a run's curve against compute, its summaries (final, auc, best, last_k), last values
    metric.py           the metric compared and which way is better (Metric)
    evidence.py         what the tests run on: each run's number, the eval's grid, per-problem scores,
                        the Metric
    health.py           health flags of one run and their thresholds
    activity.py         did a trick act: its own activity metric (from the registry) in the runs that had it on
    verdicts.py         the verdict vocabulary; a trick's verdict; a variant against a control
    power.py            each contrast's power; a `--seeds auto` sweep's looks as the report reads them
    training.py         does training beat its untrained start, per context
    transfer.py         one trick across contexts: transfer verdicts, the registry's claims beside them
    drift.py            does a run's eval peak and then fall (before a fit is read as a ceiling)
    fits.py             ScaleRL's sigmoid fit of one curve: A (ceiling), B (efficiency), poor fits
    scaling.py          the fits over seeds, the ceiling/efficiency split, predicted verdicts
    diagnostics.py      gradient conflicts, pairwise interactions, the conflict check
    build.py            Report: everything above computed once (build_report)
    formatting.py       how numbers and intervals are written
    render.py           report.md, report.csv, report.json, stdout
    render_head.py      report.md's top: three short lines and the verdict table
    render_training.py  training against its untrained start: a line at the top, a section below
    render_curves.py    the curve sections of report.md / report.json
    render_transfer.py  the section across contexts and its picture
    plots.py            the PNGs
    write.py            write_report: the files, atomically
    live.py             --watch: refresh until every run has finished
    wandb.py            --wandb summary run, --wandb-report W&B Report

The statistics themselves (t, Welch, Holm, exact tests, the sequential test and power, rliable's
aggregates) are grpo_ablate/stats, below both the report and the sweep.

Below: what the commands (cli.py, sweep/doctor.py) use.
"""
from grpo_ablate.errors import ReportError
from grpo_ablate.report.build import Report, build_report
from grpo_ablate.report.health import BREAKING_FLAGS, HealthThresholds, parse_thresholds
from grpo_ablate.report.live import watch
from grpo_ablate.report.load import load_sweep
from grpo_ablate.report.render import render_stdout
from grpo_ablate.report.wandb import build_wandb_report, check_wandb_report, log_to_wandb
from grpo_ablate.report.write import write_report

__all__ = ["BREAKING_FLAGS", "HealthThresholds", "Report", "ReportError", "build_report", "build_wandb_report",
           "check_wandb_report", "load_sweep", "log_to_wandb", "parse_thresholds", "render_stdout", "watch",
           "write_report"]
