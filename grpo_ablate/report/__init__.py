"""`grpo-ablate report`: which tricks matter — the table, verdicts, health flags, pictures.

The design: docs/design.md, "The report package".

Below: what the commands (cli/app.py, sweep/doctor.py) use, imported on first use: the sweep's plan
reads report/schema.py (a manifest's fields), and importing any module of this package runs this
file, which would otherwise load pandas and scipy (~2 s) into every `sweep --dry-run`.
"""
from grpo_ablate.errors import ReportError

_FROM = {"Report": "build", "build_report": "build", "BREAKING_FLAGS": "health", "HealthThresholds": "health",
         "parse_thresholds": "health", "watch": "live", "load_sweep": "load", "render_stdout": "render",
         "build_wandb_report": "wandb", "check_wandb_report": "wandb", "log_to_wandb": "wandb",
         "write_report": "write"}

__all__ = ["ReportError", *sorted(_FROM)]


def __getattr__(name: str):
    if name not in _FROM:
        raise AttributeError(f"module 'grpo_ablate.report' has no attribute {name!r}")
    from grpo_ablate.report import build, health, live, load, render, wandb, write

    modules = {"build": build, "health": health, "live": live, "load": load, "render": render, "wandb": wandb,
               "write": write}
    return getattr(modules[_FROM[name]], name)
