"""`grpo-ablate`: the command line. Thin: every command hands off to a module.

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
    resume: Optional[Path] = typer.Option(
        None, "--resume", help="Continue the run in this run dir from its last checkpoint."),
    restart: bool = typer.Option(False, "--restart", help="With --resume: start the run over from step 0 (one "
                                 "that stopped before its first checkpoint, or whose checkpoint is damaged); "
                                 "a finished run is never restarted."),
) -> None:
    """Train one GRPO run. Arguments are Hydra overrides: adv=dr_grpo kl=none seed=1 ..."""
    from grpo_ablate.config import ConfigError, check_here, compose, validate
    from grpo_ablate.ranks import this_rank

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
        except ConfigError as err:
            fail(str(err))
        # before Hydra writes anything there; under torchrun rank 0 holds the run's dir for all its
        # ranks (the others would find it held by rank 0 and refuse)
        held = _hold_run_dir(cfg, args) if this_rank() == 0 else None
    from grpo_ablate import entrypoint   # the training stack (transformers, ...): only once the input is good
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

    from grpo_ablate.config import ConfigError
    from grpo_ablate.rundir import DirLock, writable_problem
    from grpo_ablate.resume_rules import already_finished, open_run_dir

    given = [a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir=")]
    if not given:
        problem = writable_problem(Path("runs"))
        if problem:
            fail(f"cannot write runs/ in the working directory {Path.cwd()}: {problem}; run from a writable "
                 "directory or give hydra.run.dir=<a writable path>")
        return None
    run_dir = Path(given[-1])
    problem = writable_problem(run_dir)
    if problem:
        fail(f"cannot write the run dir {run_dir}: {problem}; give hydra.run.dir=<a writable path>")
    made = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = DirLock(run_dir, "run dir", say=lambda text: err_console.print(text, markup=False, highlight=False))
    try:
        lock.acquire()
        status, _ = open_run_dir(cfg, run_dir, restart_without_checkpoint=False)
    except ConfigError as err:
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


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sweep(
    ctx: typer.Context,
    mode: Optional[str] = typer.Argument(
        None, help="leave-one-out | add-one-in | ladder | factorial | pairwise | conflict | file PATH"),
    tricks_: Optional[str] = typer.Option(None, "--tricks", help="Named tricks, comma separated (default for "
                                          "leave-one-out: the seed review's recommended set, dynamic_sampling, "
                                          "no_std)."),
    trick: Optional[str] = typer.Option(None, "--trick", help="conflict: the new trick (any named trick)."),
    reward: Optional[str] = typer.Option(None, "--reward", help="conflict: the new reward term, a named trick "
                                         "that shapes the reward (length_penalty, length_group, overlong_punish, "
                                         "kl_in_reward)."),
    base: Optional[str] = typer.Option(None, "--base", help="Preset the tricks are added to (grpo, dapo, ...)."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="5 = seeds 0..4; or a list: 0,5,9; or auto: "
                                        "3, then one more per look until each contrast is decided (default 5)."),
    max_seeds: Optional[int] = typer.Option(None, "--max-seeds",
                                            help="--seeds auto: at most this many seeds (default 8)."),
    budget: Optional[str] = typer.Option(None, "--budget",
                                         help="--seeds auto: start no look past this wall time (90m, 2h)."),
    effect: Optional[float] = typer.Option(None, "--effect", help="--seeds auto: the smallest Δ that matters; "
                                           "a contrast whose repeated 95% interval lies inside ±X stops as "
                                           "'no effect >= X'."),
    summary: Optional[str] = typer.Option(None, "--summary", help="What the sweep decides on, fixed in its manifest "
                                          "before the first run (and what --seeds auto looks at): final, auc, best, "
                                          "last_k or last_<k>, as report --summary [last_3]."),
    launcher: Optional[str] = typer.Option(None, "--launcher", help="basic | joblib | submitit_local | "
                                           "submitit_slurm | ray (default joblib)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", help="Runs at a time (default: one per core)."),
    family: Optional[List[str]] = typer.Option(None, "--family", help="factorial over a config group's "
                                               "options (adv) or a key's values (task.level, key=a,b); repeatable."),
    across: Optional[List[str]] = typer.Option(None, "--across", help="Repeat the whole matrix in contexts: "
                                               "KEY=v1,v2 (task.level=easy,hard, reward.wrong=0,-1, "
                                               "model=tiny,tiny_aligned); repeatable: every combination."),
    max_runs: Optional[int] = typer.Option(None, "--max-runs", help="Refuse sweeps with more runs (default 128)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Training steps of every run."),
    name: Optional[str] = typer.Option(None, "--name", help="Sweep name (W&B group prefix, dir name)."),
    out: Optional[Path] = typer.Option(None, "--dir", help="Sweep dir (default runs/sweeps/<name>-<time>)."),
    controls: Optional[bool] = typer.Option(None, "--controls/--no-controls", help="Add the no-RL controls "
                                            "(untrained base, supervised run); default: on for the embedded model."),
    control_budget: Optional[str] = typer.Option(None, "--control-budget", help="The SFT control's budget: "
                                                 "tokens (B x G solutions a step) or wall (the treatments' median "
                                                 "training time; runs after them). Default tokens."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the matrix, write nothing."),
    allow_inert: bool = typer.Option(False, "--allow-inert", help="Run tricks under test that cannot act "
                                     "with these settings (refused by default; see `grpo-ablate tricks`)."),
    resume_dir: Optional[Path] = typer.Option(None, "--resume", help="Continue this sweep dir."),
    rerun: Optional[str] = typer.Option(None, "--rerun", help="--resume: start these runs over, comma separated "
                                        "(e.g. all-s0; their old dirs are kept aside)."),
) -> None:
    """Run an ablation sweep: every variant x seed is one ordinary training run.

    Extra arguments are Hydra overrides for every run (rollout.group_size=16, task.level=medium)
    or for the launcher (hydra.launcher.partition=gpu).
    """
    args = list(ctx.args)
    if resume_dir is not None and mode is not None and "=" in mode:   # `--resume DIR steps=5`: an override
        mode, args = None, [mode, *args]
    _check_options(jobs=jobs, steps=steps, max_runs=max_runs, max_seeds=max_seeds, effect=effect)
    if summary is not None:                      # a bad one is refused before any planning
        from grpo_ablate.report.curves import Summary

        try:
            Summary.parse(summary)
        except ValueError as err:
            fail(f"--summary: {err}")
    from grpo_ablate.config import ConfigError   # the config checks (no torch: a refusal stays fast)
    from grpo_ablate.sweep.launch import start
    from grpo_ablate.sweep.matrix import SweepError
    from grpo_ablate.values import ValueProblem

    try:
        if resume_dir is not None:
            planned = (("MODE", mode), ("--tricks", tricks_), ("--trick", trick), ("--reward", reward),
                       ("--base", base), ("--seeds", seeds), ("--family", family), ("--steps", steps),
                       ("--name", name), ("--dir", out), ("--max-runs", max_runs),
                       ("--controls", controls is not None), ("--control-budget", control_budget),
                       ("--effect", effect), ("--summary", summary), ("--dry-run", dry_run), ("--across", across))
            code = _resume_sweep(resume_dir, [opt for opt, value in planned if value], args, launcher, jobs,
                                 {"max_seeds": max_seeds, "budget": budget},
                                 tuple(r.strip() for r in (rerun or "").split(",") if r.strip()))
        else:
            if rerun:
                fail("--rerun belongs to --resume SWEEP_DIR")
            if mode == "conflict" or trick or reward:
                tricks_ = _conflict_tricks(mode, tricks_, trick, reward)
            request = _sweep_request(mode, args, tricks_, base, seeds, launcher, jobs, family, max_runs,
                                     steps, name, out, across)
            _given_options(request, controls, control_budget, allow_inert,
                           {"max_seeds": max_seeds, "budget": budget, "effect": effect, "summary": summary})
            if str(request.seeds) == "auto":
                from grpo_ablate.sweep import sequential   # the report's statistics (pandas, scipy)

                options = sequential.options_from(request.sequential)
                request.summary = options.summary
                code = sequential.start(request, options, console, dry_run=dry_run)
            elif set(request.sequential) - {"summary"}:
                fail(f"{', '.join('--' + k.replace('_', '-') for k in request.sequential)} "
                     "belong to --seeds auto (seeds until decided)")
            else:    # a fixed sweep fixes what it decides on too (a sweep file's `summary:` or --summary)
                given = request.sequential.pop("summary", None)
                request.summary = parse_summary(str(given), None).label if given is not None else None
                code = start(request, console, dry_run=dry_run)
    except (SweepError, ConfigError, ValueProblem) as err:
        fail(str(err))
    raise typer.Exit(code)


def _check_options(**given) -> None:
    """Options that count or size something, checked before anything heavy is imported."""
    from grpo_ablate.values import ValueProblem, check_options

    try:
        check_options(**given)
    except ValueProblem as err:
        fail(str(err))


def _given_options(request, controls, control_budget, allow_inert, sequential_given: dict) -> None:
    """The command line's controls, --allow-inert and --seeds auto options, over the sweep file's."""
    request.controls = controls if controls is not None else request.controls
    request.allow_inert = allow_inert
    if control_budget is not None:
        if control_budget not in ("tokens", "wall"):
            fail(f"--control-budget {control_budget} is not allowed; allowed: tokens, wall")
        request.control_budget = control_budget
    request.sequential.update({k: v for k, v in sequential_given.items() if v is not None})


def _resume_sweep(resume_dir: Path, given: list[str], args: list[str], launcher, jobs, sequential_limits,
                  rerun: tuple = ()) -> int:
    """`sweep --resume DIR`: the plan is the manifest's; only how and where runs run may change."""
    from grpo_ablate.sweep.launch import read_manifest

    read_manifest(resume_dir)   # not a sweep dir, or a damaged manifest: refused before the imports below
    from grpo_ablate.sweep import sequential

    train_args = [a for a in args if not a.startswith("hydra.")]
    if given or train_args:
        fail(f"--resume continues a sweep exactly as it was planned; drop {', '.join(given + train_args)} "
             "(only --launcher, --jobs, hydra.* launcher settings and, for --seeds auto, "
             "--max-seeds and --budget may change)")
    return sequential.resume_any(resume_dir, launcher, jobs, [a for a in args if a.startswith("hydra.")],
                                 console, sequential_limits, rerun)


def _conflict_tricks(mode, tricks_, trick, reward) -> str:
    """`sweep conflict --trick X --reward Y` as the matrix's trick list "X,Y"."""
    from grpo_ablate.sweep.matrix import SweepError

    if mode != "conflict":
        raise SweepError("--trick and --reward belong to `sweep conflict`; other modes take --tricks a,b,c")
    if tricks_:
        raise SweepError("sweep conflict takes --trick X --reward Y, not --tricks")
    if not trick or not reward:
        raise SweepError("sweep conflict needs --trick X and --reward Y "
                         "(e.g. --trick entropy_bonus --reward length_penalty)")
    if trick == reward:
        raise SweepError(f"--trick and --reward both name {trick}; give a trick and a different reward term")
    return f"{trick},{reward}"


def _sweep_request(mode, args, tricks_, base, seeds, launcher, jobs, family, max_runs, steps, name, out,
                   across=None):
    from grpo_ablate.sweep.launch import (DEFAULT_BASE, DEFAULT_SEEDS, DEFAULT_TRICKS, SweepRequest, axis_values)
    from grpo_ablate.sweep.matrix import (DEFAULT_MAX_RUNS, MODES, SweepError, across_contexts, file_contexts,
                                          variants_matrix)

    if mode is None:
        fail(f"give a sweep mode: {', '.join(MODES)}, or file PATH (or --resume SWEEP_DIR)")
    spec: dict = {}
    if mode == "file":
        if not args or "=" in args[0]:
            fail("sweep file needs the path of a sweep definition: grpo-ablate sweep file sweeps/dapo-ladder.yaml")
        path, args = Path(args[0]), args[1:]
        spec = _load_sweep_file(path)
        mode = spec.pop("mode")
        spec.setdefault("name", path.stem)
    elif mode not in MODES:
        fail(f"sweep mode {mode!r} is not allowed; allowed: {', '.join(MODES)}, file")
    trick_list = [t.strip() for t in tricks_.split(",") if t.strip()] if tricks_ else spec.get("tricks", [])
    axes_specs = list(family or [])
    axes = [axis_values(a) for a in axes_specs] if axes_specs else [
        (key, list(values)) if values is not None else axis_values(key)
        for key, values in (spec.get("families") or {}).items()]
    if mode == "leave-one-out" and not trick_list and not spec:
        trick_list, base = DEFAULT_TRICKS, base or DEFAULT_BASE
    hydra_args = [a for a in args if a.startswith("hydra.")]
    overrides = list(spec.get("overrides", [])) + [a for a in args if not a.startswith("hydra.")]
    bad = [a for a in overrides if a.startswith("-")]
    if bad:
        raise SweepError(f"unknown option {bad[0]}; see grpo-ablate sweep --help")
    matrix = None
    if mode == "variants":   # a file's own variants, each against its reference (sweeps/sanity.yaml)
        if tricks_ or family:
            raise SweepError("a variants sweep file defines its variants itself; drop --tricks / --family")
        matrix = variants_matrix(spec.get("variants"))
    return SweepRequest(
        mode=mode, tricks=trick_list, base=base or spec.get("base"), matrix=matrix,
        seeds=seeds or spec.get("seeds", DEFAULT_SEEDS), overrides=overrides, hydra_args=hydra_args,
        launcher=launcher or spec.get("launcher", "joblib"), jobs=jobs,
        max_runs=max_runs or spec.get("max_runs", DEFAULT_MAX_RUNS), axes=axes,
        name=name or spec.get("name"), steps=steps or spec.get("steps"), sweep_dir=out,
        controls=spec.get("controls"),
        contexts=across_contexts(across) if across else file_contexts(spec["contexts"]) if "contexts" in spec else [],
        sequential={k: spec[k] for k in ("max_seeds", "budget", "effect", "summary") if k in spec})


def _load_sweep_file(path: Path) -> dict:
    import yaml

    from grpo_ablate.sweep.matrix import SweepError
    from grpo_ablate.values import check_sweep_file, load_yaml

    if not path.exists():
        raise SweepError(f"sweep file {path} does not exist (the shipped ones are in sweeps/)")
    try:
        spec = load_yaml(path.read_text())
    except yaml.YAMLError as err:
        raise SweepError(f"sweep file {path} is not valid YAML: {str(err).splitlines()[0]}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SweepError(f"sweep file {path} cannot be read: {err}") from None
    check_sweep_file(path, {} if spec is None else spec)   # every field of its kind and in its range
    spec = {key: value for key, value in (spec or {}).items() if value is not None}   # null: the default
    if "mode" not in spec:
        raise SweepError(f"sweep file {path} has no mode; allowed: leave-one-out, add-one-in, ladder, factorial, "
                         "pairwise, variants")
    if (spec["mode"] == "variants") != ("variants" in spec) or (spec["mode"] == "variants" and "tricks" in spec):
        raise SweepError(f"sweep file {path}: `variants` (name -> overrides) goes with mode: variants, "
                         "and a variants file lists no tricks")
    spec.pop("description", None)
    return spec


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def doctor(
    ctx: typer.Context,
    tricks_: Optional[str] = typer.Option(None, "--tricks", help="Candidate tricks, comma separated "
                                          "(default: the seed review's recommended set on --base grpo)."),
    base: Optional[str] = typer.Option(None, "--base", help="Preset the tricks are added to (grpo, dapo, ...)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Training steps of every run (default 30: short)."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Seeds per set: 1 (default), 2 = 0,1, or 0,5."),
    launcher: Optional[str] = typer.Option(None, "--launcher",
                                           help="basic | joblib | submitit_local | ... (default joblib)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", help="Runs at a time (default: one per core)."),
    max_runs: Optional[int] = typer.Option(None, "--max-runs", help="Stop the search before more runs (default 32)."),
    threshold: List[str] = typer.Option([], "--threshold", help="Health-flag threshold NAME=VALUE (repeatable)."),
    out: Optional[Path] = typer.Option(None, "--dir", help="Doctor dir (default runs/doctor/<time>)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the first stages, write nothing."),
    allow_inert: bool = typer.Option(False, "--allow-inert", help="Search tricks that cannot act with these "
                                     "settings (refused by default)."),
    resume_dir: Optional[Path] = typer.Option(None, "--resume", help="Continue this doctor dir."),
) -> None:
    """Which trick breaks training? All on; if unhealthy, leave-one-out; then the smallest breaking sets.

    Prints a verdict per trick (safe / breaks training alone / breaks training together with X)
    with its evidence and writes doctor.md and doctor.json. Exit 0: every trick is safe;
    1: something breaks training; 2: bad input. Extra arguments are overrides for every run.
    """
    import time

    _check_options(jobs=jobs, steps=steps, max_runs=max_runs)   # before the training stack is imported
    if seeds is not None and seeds.strip() == "auto":
        fail("doctor asks whether any run breaks training, not whether a Δ is nonzero: there is no contrast "
             "for --seeds auto to decide; give a seed count (--seeds 2)")
    from grpo_ablate.sweep import doctor as doc
    from grpo_ablate.config import ConfigError
    from grpo_ablate.sweep.launch import DEFAULT_BASE, DEFAULT_TRICKS, plan, print_matrix
    from grpo_ablate.report import ReportError, parse_thresholds
    from grpo_ablate.sweep.matrix import SweepError

    args = list(ctx.args)
    try:
        if resume_dir is not None:
            given = [opt for opt, value in (("--tricks", tricks_), ("--base", base), ("--steps", steps),
                     ("--seeds", seeds), ("--max-runs", max_runs), ("--dir", out), ("--threshold", threshold))
                     if value]
            if given or [a for a in args if not a.startswith("hydra.")] or dry_run:
                dropped = given + [a for a in args if not a.startswith('hydra.')] + (['--dry-run'] if dry_run else [])
                fail(f"--resume continues a doctor run exactly as it was planned; drop {', '.join(dropped)}"
                     " (only --launcher, --jobs and hydra.* launcher settings may change)")
            req = doc.load_request(resume_dir)
            req.launcher, req.jobs = launcher or req.launcher, jobs if jobs is not None else req.jobs
            req.hydra_args = [a for a in args if a.startswith("hydra.")] or req.hydra_args
            doctor_dir = resume_dir
        else:
            bad = [a for a in args if a.startswith("-")]
            if bad:
                fail(f"unknown option {bad[0]}; see grpo-ablate doctor --help")
            trick_list = [t.strip() for t in tricks_.split(",") if t.strip()] if tricks_ else list(DEFAULT_TRICKS)
            parse_thresholds(threshold)   # bad names or values: one line, before anything runs
            stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
            req = doc.DoctorRequest(
                tricks=trick_list, base=base or (None if tricks_ else DEFAULT_BASE), steps=steps or doc.DEFAULT_STEPS,
                seeds=seeds or doc.DEFAULT_SEEDS, overrides=[a for a in args if not a.startswith("hydra.")],
                hydra_args=[a for a in args if a.startswith("hydra.")], launcher=launcher or "joblib", jobs=jobs,
                max_runs=max_runs or doc.DEFAULT_MAX_RUNS, group=f"doctor-{stamp}", allow_inert=allow_inert,
                thresholds=dict(item.split("=", 1) for item in threshold))
            doc.check(req)
            if dry_run:
                T = frozenset(req.tricks)
                for stage in (doc.Stage("all-on", [T]), doc.Stage("leave-one-out", [T - {t} for t in req.tricks])):
                    print_matrix(plan(doc.stage_request(req, stage, None)), console)
                console.print(f"if the all-on run breaks: leave-one-out, then subsets as needed, at most "
                              f"{req.max_runs} runs in all", markup=False, highlight=False)
                return
            doctor_dir = out or doc.new_doctor_dir(stamp)
            if doctor_dir.exists() and any(doctor_dir.iterdir()):
                fail(f"{doctor_dir} already exists and is not empty; continue it with "
                     f"`grpo-ablate doctor --resume {doctor_dir}` or pick another --dir")
        result = doc.run(req, doctor_dir, console, resume=resume_dir is not None)
    except (SweepError, ConfigError, ReportError) as err:
        fail(str(err))
    _print_doctor(result, doctor_dir)
    raise typer.Exit(0 if result["all_on_broken"] is False else 1)


def _print_doctor(result: dict, doctor_dir: Path) -> None:
    from rich.table import Table
    from rich.text import Text

    from grpo_ablate.sweep.doctor import evidence_text, summary_line

    table = Table(title=f"doctor: {summary_line(result)}")
    table.add_column("trick", no_wrap=True)
    table.add_column("verdict")
    table.add_column("evidence", overflow="fold")
    for v in result["verdicts"]:
        table.add_row(v["trick"], v["verdict"], Text(evidence_text(v)))
    console.print(table)
    console.print(f"{result['runs']} runs; wrote {doctor_dir}/doctor.md and doctor.json", markup=False,
                  highlight=False)


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
    for column in ("trick", "family=option", "what it changes", "seed review", "extra compute", "acts only with",
                   "shows it acted"):
        table.add_column(column)
    for r in rows:
        table.add_row(r["name"], f"{r['family']}={r['option']}", r["what"],
                      r["verdict"].replace("_", " "), r["cost"], r["requires"], r["activity"])
    console.print(table)


@app.command()
def report(
    sweep_dir: Path = typer.Argument(..., help="A sweep dir (manifest.json + one run dir per variant and seed)."),
    metric: str = typer.Option("eval/accuracy", "--metric", help="Metric to compare (eval/accuracy or eval_accuracy)."),
    summary: Optional[str] = typer.Option(
        None, "--summary", help="How a run's curve becomes the number compared: final, auc (compute-weighted "
        "mean over training), best, last_k (mean of the last k evals; or last_<k>) [final]."),
    last_k: Optional[int] = typer.Option(None, "--last-k", help="k of --summary last_k [3]."),
    compute: str = typer.Option("tokens", "--compute", help="The x axis of auc and the fits: tokens (sampled + "
                                "trained) or wall (seconds of the training steps)."),
    predict_from: Optional[float] = typer.Option(
        None, "--predict-from", help="Also predict every verdict from this fraction of each run's steps (0-1), "
        "beside the measured ones (a sweep still running is predicted anyway)."),
    fmt: str = typer.Option("md", "--format", help="What to print: md, csv or json (all three are written)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where report.md/.csv/.json and the PNGs go [SWEEP_DIR]."),
    watch: Optional[float] = typer.Option(
        None, "--watch", help="Refresh every SECONDS (30 when none given) until every run has finished."),
    threshold: List[str] = typer.Option(
        [], "--threshold", help="Health-flag threshold NAME=VALUE (repeatable); see README for names."),
    lower_is_better: bool = typer.Option(False, "--lower-is-better", help="The metric is a cost (e.g. a length)."),
    effect: Optional[float] = typer.Option(None, "--effect", help="The smallest Δ that matters: a CI inside ±X is "
                                           "'no effect', and the power section sizes seeds for it."),
    error_control: str = typer.Option(
        "holm", "--error-control", help="How the report's tests are adjusted together: holm (the chance of any false "
        "helps/hurts/breaks-training in the report ≤ alpha), bh (Benjamini–Hochberg: false discovery rate ≤ alpha) "
        "or none (each contrast at alpha on its own)."),
    alpha: float = typer.Option(0.05, "--alpha", help="The report's error level (family-wise for holm, FDR for bh)."),
    conflict_threshold: float = typer.Option(
        -0.1, "--conflict-threshold", help="Gradient cosine below which two terms conflict (at > half the steps)."),
    figures: bool = typer.Option(True, "--figures/--no-figures", help="Draw the PNG figures (the slow part of a "
                                 "report: ~2 s); --no-figures writes the text files only."),
    use_wandb: bool = typer.Option(False, "--wandb", help="Also log table and figures to a W&B summary run."),
    wandb_report: bool = typer.Option(False, "--wandb-report", help="Also build a W&B Report (online only)."),
) -> None:
    """Which tricks matter: table, verdicts, health flags and PNG curves for a sweep dir."""
    if not sweep_dir.is_dir():   # every check before the report's imports (pandas, scipy: seconds)
        fail(f"{sweep_dir}: no such directory")
    if fmt not in ("md", "csv", "json"):
        fail(f"--format {fmt!r} is not allowed; allowed: md, csv, json")
    if watch is not None and watch <= 0:
        fail(f"--watch {watch}: the refresh interval must be > 0 seconds")
    out_dir = out or sweep_dir
    if not -1.0 <= conflict_threshold <= 1.0:
        fail(f"--conflict-threshold {conflict_threshold} is not allowed; a cosine lies in [-1, 1]")
    if effect is not None:
        from grpo_ablate.values import ACCURACY_EFFECT, Allowed

        allowed = ACCURACY_EFFECT if "accuracy" in metric else Allowed("number", low=0, low_open=True)
        if not allowed.ok(effect):
            fail(f"--effect {effect} is not allowed for {metric}; {allowed.words()}")
    if last_k is not None and last_k < 1:
        fail(f"--last-k {last_k} is not allowed; it must be an integer >= 1")
    if last_k is not None and (summary or "").lower() != "last_k":
        fail(f"--last-k {last_k} belongs to --summary last_k (or give --summary last_{last_k})")
    if compute not in ("tokens", "wall"):
        fail(f"--compute {compute!r} is not allowed; allowed: tokens, wall")
    if error_control not in ("holm", "bh", "none"):
        fail(f"--error-control {error_control!r} is not allowed; allowed: holm, bh, none")
    if not 0 < alpha < 0.5:
        fail(f"--alpha {alpha} is not allowed; it must lie in (0, 0.5)")
    if predict_from is not None and not 0 < predict_from < 1:
        fail(f"--predict-from {predict_from} is not allowed; give the fraction of each run's steps, in (0, 1)")
    from grpo_ablate import report as rep

    options = {"metric": metric, "higher_is_better": not lower_is_better, "conflict_threshold": conflict_threshold,
               "effect": effect, "summary": parse_summary(summary, last_k), "predict_from": predict_from,
               "compute": compute, "error_control": error_control, "alpha": alpha}
    try:
        options["thresholds"] = rep.parse_thresholds(threshold)
        if wandb_report:
            rep.check_wandb_report()
        if watch is not None:
            try:
                result = rep.watch(sweep_dir, watch, out_dir, fmt, **options)
            except KeyboardInterrupt:
                err_console.print("stopped watching (the files hold the last refresh)", highlight=False)
                raise typer.Exit(0)
        else:
            result = rep.build_report(sweep_dir, **options)
        paths = rep.write_report(result, out_dir, figures=figures)
        if watch is None:
            print(rep.render_stdout(result, fmt))
        err_console.print(f"wrote {out_dir}/report.md, report.csv, report.json and "
                          f"{sum(p.suffix == '.png' for p in paths)} figures", markup=False, highlight=False)
        if use_wandb:
            err_console.print(rep.log_to_wandb(result, out_dir, paths), markup=False, highlight=False)
        if wandb_report:
            err_console.print(f"W&B Report: {rep.build_wandb_report(result)}", markup=False, highlight=False)
    except rep.ReportError as err:
        fail(str(err))
    except OSError as err:
        fail(f"cannot write the report to {out_dir}: {err}")


def _resume_args(run_dir: Path, restart: bool = False) -> List[str]:
    """The run's own overrides, pointed back at its directory."""
    from grpo_ablate.errors import DamagedFile
    from grpo_ablate.rundir import read_overrides

    try:
        saved = read_overrides(run_dir)
    except DamagedFile as err:
        copy = run_dir / ".hydra" / "overrides.yaml"
        fail(f"--resume {run_dir}: {err.path.name} {err.problem}; "
             + (f"restore it from {copy} (the same list)" if copy.exists() else "start a new run"))
    if saved is None:
        fail(f"--resume {run_dir}: not a grpo-ablate run dir (no overrides.yaml there)")
    previous = [o for o in saved if not o.startswith(("resume=", "hydra.run.dir="))]
    return previous + [f"hydra.run.dir={run_dir}", "resume=restart" if restart else "resume=true"]


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
    except (typer.Abort, KeyboardInterrupt):   # Ctrl-C (a run records itself first: stopping.py)
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
