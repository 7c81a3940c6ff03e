"""`grpo-ablate`: the command line. Thin: every command hands off to a module.

`sweep`, `doctor`, `eval` and `report` parse their options into a frozen request (requests.py,
sweep/requests.py), check it there (a refusal imports nothing heavy) and hand it to the package that
does the work (sweep/command.py, sweep/doctor.py, rescore/, report/). Their options are declared
once, as their request's fields (request_fields.py), and their signature is built from those
(options.takes); `train`'s two are declared in options.py.
`train` is a typer command that passes its arguments to the `@hydra.main` entrypoint, so
Hydra's override grammar (`group=option`, `+group=option`, `key=value`), `--cfg job` and
`-m` all work. Before Hydra creates a run dir, the config is composed and validated here, so
bad input is one line on stderr, exit code 2, and no directory left behind.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from grpo_ablate.cli import options as opt
from grpo_ablate.request_fields import from_command_line
from grpo_ablate.errors import UserError
from grpo_ablate.cli.requests import EvalArgs, ReportRequest
from grpo_ablate.sweep.requests import DoctorArgs, SweepArgs

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Ablation runner for GRPO training tricks.")
console = Console(soft_wrap=True)  # paths and overrides stay on one line
err_console = Console(stderr=True)

# Hydra flags that do not start a training run (or that start several)
_HYDRA_NON_RUN_FLAGS = ("--cfg", "-c", "--info", "-i", "--hydra-help", "--resolve", "--package", "-p")
_HYDRA_MULTIRUN_FLAGS = ("-m", "--multirun")


@app.callback()
def _root() -> None:
    """Ablation runner for GRPO training tricks: all on, drop one at a time, with seeds."""


def parse_summary(text: Optional[str], k: Optional[int]):
    """report --summary / --last-k as a Summary (None: the default); a bad one is one line and exit 2."""
    from grpo_ablate.report.curves import DEFAULT_SUMMARY, Summary

    if text is None and k is None:
        return None            # the summary the sweep fixed in its manifest (final when it fixed none)
    try:
        return Summary.parse(text or DEFAULT_SUMMARY, k)
    except ValueError as err:
        fail(str(err))


def fail(message: str, code: int = 2) -> None:
    """One clear line, non-zero exit, no traceback."""
    err_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train(
    ctx: typer.Context,
    resume: Optional[Path] = opt.TRAIN_RESUME,
    restart: bool = opt.TRAIN_RESTART,
) -> None:
    """Train one GRPO run. Arguments are Hydra overrides: adv=dr_grpo kl=none seed=1 ..."""
    from grpo_ablate.config.compose import compose
    from grpo_ablate.config.here import check_here
    from grpo_ablate.config.validate import validate
    from grpo_ablate.rundir.ranks import this_rank

    if restart and resume is None:
        fail("--restart belongs to --resume RUN_DIR (it starts that run over)")
    args: List[str] = list(ctx.args)
    if resume is not None:
        args = _last_wins(_resume_args(resume, restart) + args)
    overrides = [a for a in args if not a.startswith("-")]
    single_run = not any(a in _HYDRA_NON_RUN_FLAGS + _HYDRA_MULTIRUN_FLAGS
                         or a.startswith(("--cfg=", "--info=")) for a in args)
    held = None
    if single_run:
        try:
            cfg = compose([o for o in overrides if not o.startswith("hydra")])
            validate(cfg)
            check_here(cfg)   # this machine can run it: packages, a GPU, the hub, torchrun, the model cache
        except UserError as err:
            fail(str(err))
        # before Hydra writes anything there; under torchrun rank 0 holds the run's dir for all its
        # ranks (the others would find it held by rank 0 and refuse)
        held = _hold_run_dir(cfg, args) if this_rank() == 0 else None
        args = _run_dir_quoted(args)
    from grpo_ablate.train import entrypoint  # the training stack (transformers, ...): only once the input is good
    try:
        code = entrypoint.run_hydra(args)
    finally:
        if held is not None:
            held[0].release()
            if held[1]:   # a run dir made here for a run that never started: not left behind
                entrypoint.remove_if_unused(held[0].directory)
    raise typer.Exit(code)


def _hold_run_dir(cfg, args: List[str]):
    """The run dir of a single run, locked against a second process and checked (resume rules,
    damaged files) before Hydra writes its config there; (lock, made here) or None when Hydra
    picks a new dir. A refusal leaves the dir as it was; a resume with nothing to do ends here."""
    import shutil

    from grpo_ablate.rundir.lock import DirLock
    from grpo_ablate.rundir.paths import confined_dir, hydra_unquoted, writable_problem
    from grpo_ablate.config.resume_rules import already_finished, open_run_dir

    given = [hydra_unquoted(a.split("=", 1)[1]) for a in args if a.startswith("hydra.run.dir=")]
    if not given:
        problem = writable_problem(Path("runs"))
        if problem:
            fail(f"cannot write runs/ in the working directory {Path.cwd()}: {problem}; run from a writable "
                 "directory or give hydra.run.dir=<a writable path>")
        return None
    try:
        run_dir = confined_dir(given[-1], "hydra.run.dir")
    except UserError as err:
        fail(str(err))
    problem = writable_problem(run_dir)
    if problem:
        fail(f"cannot write the run dir {run_dir}: {problem}; give hydra.run.dir=<a writable path>")
    made = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = DirLock(run_dir, "run dir", say=lambda text: err_console.print(text, markup=False, highlight=False))
    try:
        lock.acquire()
        status, _ = open_run_dir(cfg, run_dir, restart_without_checkpoint=False)
    except UserError as err:
        lock.release()
        if made:
            shutil.rmtree(run_dir, ignore_errors=True)
        fail(str(err))
    if already_finished(status, cfg):   # nothing to do: nothing is written, not even Hydra's .hydra/
        lock.release()
        console.print(f"{run_dir} is already {status['state']} at step {status['step']}; nothing to do",
                      markup=False, highlight=False)
        raise typer.Exit(3 if status["state"] == "diverged" else 0)
    return lock, made


def _run_dir_quoted(args: List[str]) -> List[str]:
    """The run dir Hydra gets, quoted: the one that was checked and locked, whatever its characters."""
    from grpo_ablate.rundir.paths import hydra_quoted, hydra_unquoted

    given = [a for a in args if a.startswith("hydra.run.dir=")]
    if not given:
        return args
    quoted = f"hydra.run.dir={hydra_quoted(hydra_unquoted(given[-1].split('=', 1)[1]))}"
    return [a for a in args if not a.startswith("hydra.run.dir=")] + [quoted]


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@opt.takes(SweepArgs)
def sweep(ctx: typer.Context, **options) -> None:
    """Run an ablation sweep: every variant x seed is one ordinary training run.

    Extra arguments are Hydra overrides for every run (rollout.group_size=16, task.level=medium)
    or for the launcher (hydra.launcher.partition=gpu).
    """
    args = list(ctx.args)
    mode = options["mode"]
    if options["resume_dir"] is not None and mode is not None and "=" in mode:   # `--resume DIR steps=5`
        options["mode"], args = None, [mode, *args]
    given = from_command_line(SweepArgs, args, options)
    _refused(given.check)   # the declared ranges (the request's fields), before anything heavy is imported
    if given.summary is not None:                      # a bad one is refused before any planning
        from grpo_ablate.report.curves import Summary

        _refused(lambda: Summary.parse(given.summary), "--summary: ")
    from grpo_ablate.sweep import command   # the config checks (no torch: a refusal stays fast)

    try:
        code = command.run(given, console)
    except UserError as err:
        fail(str(err))
    raise typer.Exit(code)


def _refused(check, prefix: str = "") -> None:
    """`check()`, a value that is not allowed (ValueError) as one line and exit code 2."""
    try:
        check()
    except ValueError as err:
        fail(prefix + str(err))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@opt.takes(DoctorArgs)
def doctor(ctx: typer.Context, **options) -> None:
    """Which trick breaks training? All on; if unhealthy, leave-one-out; then the smallest breaking sets.

    Prints a verdict per trick (safe / breaks training alone / breaks training together with X)
    with its evidence and writes doctor.md and doctor.json. Exit 0: every trick is safe;
    1: something breaks training; 2: bad input. Extra arguments are overrides for every run.
    --lint FILE lists a sweep file's pair rules instead (exit 1: one holds that the file does not expect).
    """
    given = from_command_line(DoctorArgs, ctx.args, options)
    _refused(given.check)   # before the training stack is imported
    from grpo_ablate.sweep import doctor as doc

    try:
        if given.lint is not None:   # a sweep file's pair rules, nothing run
            raise typer.Exit(doc.lint(given, console))
        done = doc.command(given, console)
    except UserError as err:
        fail(str(err))
    if done is None:   # a dry run
        return
    result, doctor_dir = done
    doc.print_result(result, doctor_dir, console)
    raise typer.Exit(0 if result["all_on_broken"] is False else 1)


@app.command(name="eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@opt.takes(EvalArgs)
def eval_command(ctx: typer.Context, **options) -> None:
    """Score finished runs under an eval protocol: k samples at a temperature (avg@k, pass@k, maj@k).

    DIR is a run dir or a sweep dir; extra arguments override the protocol (eval=sampled, the default;
    eval.samples=16 eval.temperature=0.6) or the task (task=jsonl task.path=bench.jsonl). Results go
    to evals/<name>.jsonl in each run dir; `grpo-ablate report DIR --eval <name>` decides on them.
    """
    given = from_command_line(EvalArgs, ctx.args, options)
    _refused(given.check)
    from grpo_ablate.rescore import command  # the config layer; the training stack once the plan holds

    try:
        code = command.run(command.EvalRequest(given.directory, given.args, given.name, given.steps, given.threads),
                           console)
    except UserError as err:
        fail(str(err))
    raise typer.Exit(code)


@app.command()
def tricks(
    fmt: str = opt.TRICKS_FMT,
) -> None:
    """Catalogue of the named tricks (table, json or md)."""
    from grpo_ablate.config.catalogue import load_catalogue, render

    if fmt not in ("table", "json", "md"):
        fail(f"--format {fmt!r} is not allowed; allowed: table, json, md")
    rows = load_catalogue()
    if fmt != "table":
        print(render(rows, fmt))
        return
    from rich.table import Table

    table = Table(title=f"{len(rows)} named tricks (use as +trick=<name>)")
    for column in ("trick", "family=option", "what it changes", "seed review", "extra compute", "acts only with",
                   "shows it acted"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["name"], f"{r['family']}={r['option']}", r["what"],
                      r["verdict"].replace("_", " "), r["cost"], r["requires"], r["activity"])
    console.print(table)


@app.command()
@opt.takes(ReportRequest)
def report(ctx: typer.Context, **options) -> None:
    """Which tricks matter: table, verdicts, health flags and PNG curves for a sweep dir."""
    req = from_command_line(ReportRequest, None, options)
    problem = req.problem()
    if problem:   # every check before the report's imports (pandas, scipy: seconds)
        fail(problem)
    from grpo_ablate import report as rep

    built = {"metric": req.metric, "higher_is_better": not req.lower_is_better,
             "conflict_threshold": req.conflict_threshold, "effect": req.effect,
             "summary": parse_summary(req.summary, req.last_k), "predict_from": req.predict_from,
             "compute": req.compute, "error_control": req.error_control, "alpha": req.alpha, "test": req.test,
             "eval_name": req.eval_name}
    try:
        _write_report(rep, req, built)
    except UserError as err:
        fail(str(err))
    except OSError as err:
        fail(f"cannot write the report to {req.out_dir}: {err}")


def _write_report(rep, req: ReportRequest, options: dict) -> None:
    """Build the report (or watch the sweep, refreshing it), write its files, print it, say where they went."""
    out_dir = req.out_dir
    options["thresholds"] = rep.parse_thresholds(list(req.threshold))
    if req.wandb_report:
        rep.check_wandb_report()
    if req.watch is not None:
        try:
            result = rep.watch(req.sweep_dir, req.watch, out_dir, req.fmt, **options)
        except KeyboardInterrupt:
            err_console.print("stopped watching (the files hold the last refresh)", highlight=False)
            raise typer.Exit(0)
    else:
        result = rep.build_report(req.sweep_dir, **options)
    paths = rep.write_report(result, out_dir, figures=req.figures)
    if req.watch is None:
        print(rep.render_stdout(result, req.fmt))
    for line in result.sweep.warnings:   # a run left out (a damaged file, another sweep's run): one line each
        err_console.print(line, markup=False, highlight=False, soft_wrap=True)
    err_console.print(f"wrote {out_dir}/report.md, report.csv, report.json and "
                      f"{sum(p.suffix == '.png' for p in paths)} figures", markup=False, highlight=False)
    if req.use_wandb:
        err_console.print(rep.log_to_wandb(result, out_dir, paths), markup=False, highlight=False)
    if req.wandb_report:
        err_console.print(f"W&B Report: {rep.build_wandb_report(result)}", markup=False, highlight=False)


def _resume_args(run_dir: Path, restart: bool = False) -> List[str]:
    """The run's own overrides, pointed back at its directory, with the eval protocol it recorded: a run
    resumes with the eval it started with, whatever the default is now (greedy, for a run from before
    there were protocols)."""
    from grpo_ablate.errors import DamagedFile
    from grpo_ablate.rundir.files import read_overrides, recorded_eval

    try:
        saved = read_overrides(run_dir)
    except DamagedFile as err:
        copy = run_dir / ".hydra" / "overrides.yaml"
        fail(f"--resume {run_dir}: {err.path.name} {err.problem}; "
             + (f"restore it from {copy} (the same list)" if copy.exists() else "start a new run"))
    if saved is None:
        fail(f"--resume {run_dir}: not a grpo-ablate run dir (no overrides.yaml there)")
    previous = [o for o in saved if not o.startswith(("resume=", "hydra.run.dir="))]
    recorded = recorded_eval(run_dir)
    if not any(o.lstrip("+").split("=", 1)[0] == "eval" for o in previous) and _is_eval_option(recorded):
        previous = [f"eval={recorded}", *previous]
    return previous + [f"hydra.run.dir={run_dir}", "resume=restart" if restart else "resume=true"]


def _is_eval_option(name: str) -> bool:
    """Whether `name` is an option of the eval group (conf/eval/<name>.yaml)."""
    from importlib import resources

    return resources.files("grpo_ablate.conf").joinpath("eval", f"{name}.yaml").is_file()


def _last_wins(args: List[str]) -> List[str]:
    """Drop earlier overrides of a key given again later (a resumed run's `steps=...`)."""
    key = lambda a: a.lstrip("+~").split("=", 1)[0] if "=" in a and not a.startswith("-") else a
    last = {key(a): i for i, a in enumerate(args)}
    return [a for i, a in enumerate(args) if last[key(a)] == i]


def _with_given_value(message: str) -> str:
    """click's "Invalid value for '--max-seeds': ..." with the value the user gave: "--max-seeds 'abc': ..."."""
    import re

    match = re.match(r"Invalid value for '(--[\w-]+)': (.*)", message)
    if not match:
        return message
    option, why = match.groups()
    args = sys.argv[1:]
    given = next((a.split("=", 1)[1] for a in args if a.startswith(option + "=")), None)
    if given is None and option in args and args.index(option) + 1 < len(args):
        given = args[args.index(option) + 1]
    return f"{option} {given!r} is not allowed: {why[0].lower() + why[1:]}" if given is not None else message


def _optional_value(args: List[str], option: str, default: str) -> List[str]:
    """`report DIR --watch` with no number: typer options cannot have an optional value, so
    the default is put in before parsing."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg == option:
            following = out[i + 1] if i + 1 < len(out) else None
            try:
                float(following)
            except (TypeError, ValueError):
                out.insert(i + 1, default)
            break
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "report":
        sys.argv = _optional_value(sys.argv, "--watch", "30")
    try:
        code = app(standalone_mode=False)   # click's errors come back here, not as its 3-line usage block
    except (typer.Abort, KeyboardInterrupt):   # Ctrl-C (a run records itself first: rundir/stopping.py)
        code = 130
    except Exception as err:                # click's own checks (`--max-seeds abc`), whichever click typer ships
        if not (hasattr(err, "format_message") and hasattr(err, "exit_code")):
            raise
        ctx = getattr(err, "ctx", None)
        if type(err).__name__ == "NoArgsIsHelpError" and ctx is not None:   # `grpo-ablate` alone: its help
            print(ctx.get_help())
            code = 0
        else:
            where = f"; see {ctx.command_path} --help" if ctx is not None else ""
            err_console.print(f"error: {_with_given_value(err.format_message().rstrip('.'))}{where}", markup=False,
                              highlight=False, soft_wrap=True)
            code = err.exit_code
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
