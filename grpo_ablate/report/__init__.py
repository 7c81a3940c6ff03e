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

    load.py         the sweep dir: manifest, run dirs, controls, contrasts (Run, Sweep)
    stats.py        t quantile, mean and Δ with their 95% intervals, a run's final value
    curves.py       a run's curve against compute, and its summaries (final, auc, best, last_k)
    fits.py         ScaleRL's sigmoid fit of one curve: A (ceiling), B (efficiency), poor fits
    scaling.py      the fits over seeds, the ceiling/efficiency split, predicted verdicts
    aggregate.py    rliable's IQM and probability of improvement (scipy)
    health.py       health flags of one run and their thresholds
    verdicts.py     the verdict vocabulary; a trick's verdict; a variant against a control
    diagnostics.py  gradient conflicts, pairwise interactions, the conflict check
    build.py        Report: everything above computed once (build_report)
    formatting.py   how numbers and intervals are written
    render.py       report.md, report.csv, report.json, stdout
    render_curves.py  the curve sections of report.md / report.json
    plots.py        the PNGs
    write.py        write_report: the files, atomically
    live.py         --watch: refresh until every run has finished
    wandb.py        --wandb summary run, --wandb-report W&B Report

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
