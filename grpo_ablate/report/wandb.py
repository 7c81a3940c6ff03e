"""The report in W&B (`--wandb`, `--wandb-report`): a summary run with the table, the verdicts
and the PNGs in the sweep's group, and a W&B Report with comparison panels (online only).

wandb and wandb_workspaces are imported where they are used: the report itself needs neither.
(This module is `grpo_ablate.report.wandb`; `import wandb` below is the W&B package.)
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pandas as pd

from grpo_ablate.errors import ReportError
from grpo_ablate.report.build import Report
from grpo_ablate.report.health import shown_thresholds
from grpo_ablate.report.load import nested_value
from grpo_ablate.report.render import control_lines, flat_rows, variants_table, verdict_lines
from grpo_ablate.wandb_auth import wandb_api_key


def logger_settings(report: Report) -> tuple[str, str | None]:
    """Project and entity the sweep's runs logged to (from their config.yaml)."""
    for r in report.sweep.runs:
        project = nested_value(r.config, "logger", "project")
        if project:
            return str(project), nested_value(r.config, "logger", "entity")
    return "grpo-ablate", None


def log_to_wandb(report: Report, out_dir: Path, figures: list[Path]) -> str:
    """The table, the verdicts and the PNGs to a summary run (job_type `report`) in the
    sweep's W&B group; offline by itself when no API key is configured, like the runs."""
    import wandb

    project, entity = logger_settings(report)
    mode = os.environ.get("WANDB_MODE") or ("online" if wandb_api_key() else "offline")
    group = report.sweep.wandb_group or report.sweep.name
    run = wandb.init(project=project, entity=entity, dir=str(out_dir), mode=mode, group=group,
                     job_type="report", name=f"report-{report.sweep.name}",
                     config={"metric": report.metric, "sweep_id": report.sweep.sweep_id,
                             "thresholds": shown_thresholds(report.thresholds, report.sweep.runs)},
                     settings=wandb.Settings(x_disable_stats=True, console="off", silent=True))
    verdicts = pd.DataFrame([{"trick": v["trick"], "with": v["with"], "without": v["without"],
                              "verdict": v["verdict"], "delta": v["delta"].mean, "ci_low": v["delta"].low,
                              "ci_high": v["delta"].high, "why": v["why"]} for v in report.verdicts])
    data = {"report/variants": wandb.Table(dataframe=flat_rows(report))}
    if len(verdicts):
        data["report/verdicts"] = wandb.Table(dataframe=verdicts)
    data.update({f"report/{p.stem}": wandb.Image(str(p)) for p in figures if p.suffix == ".png"})
    run.log(data)
    run_id = run.id
    run.finish()
    return f"W&B {mode} run {run_id} (group {group}, job_type report)"


def check_wandb_report() -> None:
    """A W&B Report exists only online: refuse early, with the reason, in one line."""
    mode = os.environ.get("WANDB_MODE")
    if mode in ("offline", "disabled", "dryrun"):
        raise ReportError(f"--wandb-report builds a W&B Report online, but WANDB_MODE={mode}")
    if not wandb_api_key():
        raise ReportError("--wandb-report needs a W&B login (WANDB_API_KEY or `wandb login`): "
                          "W&B Reports exist only online")
    if importlib.util.find_spec("wandb_workspaces") is None:
        raise ReportError("--wandb-report needs wandb-workspaces: pip install wandb-workspaces")


def build_wandb_report(report: Report) -> str:
    """A W&B Report with the verdicts and comparison panels over the sweep's group. Online
    only (check_wandb_report first); returns its URL."""
    import wandb_workspaces.reports.v2 as wr

    project, entity = logger_settings(report)
    group = report.sweep.wandb_group or report.sweep.name
    metrics = [report.metric] + [c for c in ("reward/mean", "length/mean", "policy/entropy", "kl/k3")
                                 if c != report.metric]
    runset = wr.Runset(entity=entity or "", project=project, name=group,
                       filters=f"Group = '{group}' and JobType != 'report'", groupby=["config.sweep.variant"])
    panels = [wr.LinePlot(title=m, x="Step", y=[m], groupby_aggfunc="mean", groupby_rangefunc="minmax")
              for m in metrics] + [wr.RunComparer(diff_only="split")]
    kwargs = {"entity": entity} if entity else {}
    doc = wr.Report(project=project, title=f"grpo-ablate: {report.sweep.name}"[:128],
                    description=f"Which tricks matter ({report.metric}); made by grpo-ablate report",
                    blocks=[wr.H1(text="Verdicts per trick"), wr.MarkdownBlock(text="\n".join(verdict_lines(report))),
                            *([wr.H1(text="Against the controls"),
                               wr.MarkdownBlock(text="\n".join(control_lines(report)))]
                              if report.controls else []),
                            wr.H1(text="Variants"), wr.MarkdownBlock(text=variants_table(report)),
                            wr.PanelGrid(runsets=[runset], panels=panels)], **kwargs)
    doc.save()
    return doc.url
