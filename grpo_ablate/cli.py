"""`grpo-ablate`: the command line. Thin: every command hands off to a module.

`train` is a typer command that passes its arguments to the `@hydra.main` entrypoint, so
Hydra's override grammar (`group=option`, `+group=option`, `key=value`), `--cfg job` and
`-m` all work. Before Hydra creates a run dir, the config is composed and validated here, so
bad input is one line on stderr, exit code 2, and no directory left behind.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Ablation runner for GRPO training tricks.")
console = Console()
err_console = Console(stderr=True)

# Hydra flags that do not start a training run (or that start several)
_HYDRA_NON_RUN_FLAGS = ("--cfg", "-c", "--info", "-i", "--hydra-help", "--resolve", "--package", "-p")
_HYDRA_MULTIRUN_FLAGS = ("-m", "--multirun")


@app.callback()
def _root() -> None:
    """Ablation runner for GRPO training tricks: all on, drop one at a time, with seeds."""


def fail(message: str, code: int = 2) -> None:
    """One clear line, non-zero exit, no traceback."""
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train(
    ctx: typer.Context,
    resume: Optional[Path] = typer.Option(
        None, "--resume", help="Continue the run in this run dir from its last checkpoint."),
) -> None:
    """Train one GRPO run. Arguments are Hydra overrides: adv=dr_grpo kl=none seed=1 ..."""
    from grpo_ablate import entrypoint
    from grpo_ablate.config import ConfigError, check_here, compose, validate

    args: List[str] = list(ctx.args)
    if resume is not None:
        args = _last_wins(_resume_args(resume) + args)
    overrides = [a for a in args if not a.startswith("-")]
    single_run = not any(a in _HYDRA_NON_RUN_FLAGS + _HYDRA_MULTIRUN_FLAGS
                         or a.startswith(("--cfg=", "--info=")) for a in args)
    if single_run:
        try:
            cfg = compose([o for o in overrides if not o.startswith("hydra")])
            validate(cfg)
            check_here(cfg)   # this machine can run it: packages, a GPU, the hub, torchrun
        except ConfigError as err:
            fail(str(err))
    code = entrypoint.run_hydra(args)
    raise typer.Exit(code)


@app.command()
def tricks(fmt: str = typer.Option("table", "--format", help="table, json or md")) -> None:
    """Catalogue of the named tricks (table, json or md)."""
    from grpo_ablate.catalogue import load_catalogue, render

    if fmt not in ("table", "json", "md"):
        fail(f"--format {fmt!r} is not allowed; allowed: table, json, md")
    rows = load_catalogue()
    if fmt != "table":
        print(render(rows, fmt))
        return
    from rich.table import Table

    table = Table(title=f"{len(rows)} named tricks (use as +trick=<name>)")
    for column in ("trick", "family=option", "what it changes", "seed review", "extra compute"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["name"], f"{r['family']}={r['option']}", r["what"],
                      r["verdict"].replace("_", " "), r["cost"])
    console.print(table)


def _resume_args(run_dir: Path) -> List[str]:
    """The run's own overrides, pointed back at its directory."""
    from omegaconf import OmegaConf

    saved = run_dir / "overrides.yaml"
    if not saved.exists():
        fail(f"--resume {run_dir}: not a grpo-ablate run dir (no overrides.yaml there)")
    previous = [o for o in OmegaConf.to_container(OmegaConf.load(saved))
                if not o.startswith(("resume=", "hydra.run.dir="))]
    return previous + [f"hydra.run.dir={run_dir}", "resume=true"]


def _last_wins(args: List[str]) -> List[str]:
    """Drop earlier overrides of a key given again later (a resumed run's `steps=...`)."""
    key = lambda a: a.lstrip("+~").split("=", 1)[0] if "=" in a and not a.startswith("-") else a
    last = {key(a): i for i, a in enumerate(args)}
    return [a for i, a in enumerate(args) if last[key(a)] == i]


def main() -> None:
    app()


if __name__ == "__main__":
    main()
