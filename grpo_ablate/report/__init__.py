"""`grpo-ablate report`: which tricks matter — the table, verdicts, health flags, pictures.

The design: docs/design.md, "The report package".
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
