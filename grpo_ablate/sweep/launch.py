"""Starting a sweep's runs: `start` and `resume`, through Hydra's launchers (local jobs, SLURM, Ray).

`start` plans (plan.py), creates the sweep dir (manifest.py) and launches; `resume` re-launches
only what is unfinished and never rewrites a finished run. The runs go through Hydra's
launcher plugins via the thin sweeper in `hydra_plugins/`; local launchers split this
machine's cores among parallel runs. The training stack (torch, transformers) is imported
only once runs start, so planning and every refusal before it stay fast.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import statistics
import time
from pathlib import Path

from grpo_ablate.design import manifest_variants
from grpo_ablate.errors import DamagedFile
from grpo_ablate.model_source import gguf_source
from grpo_ablate.rundir.cores import cpu_threads, free_cores
from grpo_ablate.rundir.files import atomic_write_text, read_overrides, read_rows, read_status
from grpo_ablate.rundir.lock import DirLock
from grpo_ablate.rundir.paths import confined_dir, hydra_quoted
from grpo_ablate.rundir.starts import other_starts, recorded_start
from grpo_ablate.rundir.stopping import RunInterrupted, stop_workers_on_signals
from grpo_ablate.sweep.console import contexts_text, cpus, print_matrix, print_pair_rules, print_summary
from grpo_ablate.sweep.manifest import (FINISHED, check_new_dir, create_sweep_dir, planned_sweep_dir, read_manifest,
                                        refresh_statuses, sweep_id_of, write_manifest)
from grpo_ablate.sweep.matrix import SweepError
from grpo_ablate.sweep.plan import (LOCAL_LAUNCHERS, SweepRequest, compose_run, composed_hash, pin_planned_eval, plan,
                                   warm_starts_to_build)
from grpo_ablate.tasks import build_task


# --launcher -> (the Hydra launcher config, the plugin module that provides it, the extra)
LAUNCHERS = {
    "basic": ("basic", None, None),
    "joblib": ("joblib", "hydra_plugins.hydra_joblib_launcher", "grpo-ablate"),
    "submitit_local": ("submitit_local", "hydra_plugins.hydra_submitit_launcher", "grpo-ablate"),
    "submitit_slurm": ("submitit_slurm", "hydra_plugins.hydra_submitit_launcher", "grpo-ablate"),
    "ray": ("ray", "hydra_plugins.hydra_ray_launcher", "grpo-ablate[ray]"),
}
WORKER_LAUNCHERS = ("joblib", "submitit_local")            # ... in worker processes the sweep starts
STOPPED = 128   # run_jobs' exit code from here up: a signal stopped the sweep (128 + its number)


def start(req: SweepRequest, console, dry_run: bool = False) -> int:
    """Plan, (dry run: print) create the sweep dir, launch, summarise. Returns the exit code."""
    check_launcher(req.launcher, req.jobs)
    if req.sweep_dir is not None:   # before planning: a --dir that is not allowed or taken is refused at once
        confined_dir(req.sweep_dir, "--dir")
        if not dry_run:
            check_new_dir(Path(req.sweep_dir))
    configs: dict = {}   # each variant's config, composed once for the plan and the warm-start check
    manifest = plan(req, configs)
    planned_sweep_dir(req, manifest)   # a dry run refuses what the real one would
    if dry_run:
        print_matrix(manifest, console)
        if manifest.get("contexts"):
            console.print(contexts_text(manifest, req), markup=False, highlight=False)
        for line in warm_starts_to_build(manifest, configs):
            console.print(line, markup=False, highlight=False)
        if any(run.get("deferred") for run in manifest["runs"]):
            console.print("the SFT control's wall-clock budget is measured when the sweep runs: the median training "
                          "time of its treatment runs", markup=False, highlight=False)
        return 0
    sweep_dir = create_sweep_dir(req, manifest)
    console.print(f"sweep {manifest['name']}: {len(manifest['variants'])} variants x "
                  f"{len(manifest['seeds'])} seeds = {len(manifest['runs'])} runs -> {sweep_dir}",
                  markup=False, highlight=False)
    print_pair_rules(manifest, console)
    fixed = manifest["decides_on"]
    if fixed.get("eval"):
        steps = "" if fixed["summary"] == "final" else " --steps all"
        console.print(f"decides on the {fixed['summary']} {fixed['metric']} of eval {fixed['eval']}, scored after "
                      f"training: once the runs finish, `grpo-ablate eval {sweep_dir} eval={fixed['eval']}{steps}`, "
                      f"then `grpo-ablate report {sweep_dir}`", markup=False, highlight=False)
    with DirLock(sweep_dir, "sweep dir"):
        code = run_jobs(sweep_dir, manifest, manifest["runs"], req.launcher, req.jobs, req.hydra_args, console)
        say_other_starts(sweep_dir, manifest, console)   # runs that landed on machines with other warm starts
        return code


def resume(sweep_dir: Path, launcher: str | None, jobs: int | None, hydra_args: list[str], console,
           rerun: tuple = ()) -> int:
    """Skip finished runs, continue killed ones from their checkpoints, rerun failed ones (and
    those named in `rerun`, e.g. one whose status.json was damaged). With nothing to do it
    writes nothing."""
    sweep_dir = Path(sweep_dir)
    manifest = read_manifest(sweep_dir)
    launcher = launcher or manifest.get("launcher", "joblib")
    check_launcher(launcher, jobs)
    pin_planned_eval(manifest)   # planned when greedy was the only eval: it goes on greedy (written as it runs)
    names = [run["run_dir"] for run in manifest["runs"]]
    unknown = [name for name in rerun if name not in names]
    if unknown:
        raise SweepError(f"--rerun {', '.join(unknown)}: not a run of {sweep_dir}; its runs: "
                         f"{', '.join(names[:6])}{', ...' if len(names) > 6 else ''}")
    todo, statuses = _runs_to_resume(sweep_dir, manifest, rerun)
    named = say_other_starts(sweep_dir, manifest, console)
    if not todo:   # nothing to do: nothing is written
        console.print(f"{sweep_dir}: all {len(names)} runs finished; nothing to do", markup=False, highlight=False)
        refresh_statuses(sweep_dir, manifest)   # in memory, for the summary
        print_summary(manifest, console, sweep_dir)
        return 0 if all(run["status"] in FINISHED for run in manifest["runs"]) else 1
    _set_aside_failed(sweep_dir, todo, statuses, rerun, console)
    done = len(manifest["runs"]) - len(todo)
    console.print(f"resuming {sweep_dir}: {done} of {len(manifest['runs'])} runs finished, "
                  f"{len(todo)} to run", markup=False, highlight=False)
    code = run_jobs(sweep_dir, manifest, todo, launcher, jobs, hydra_args, console, resume=True)
    say_other_starts(sweep_dir, manifest, console, named)   # the runs just trained here, too
    return code


def say_other_starts(sweep_dir: Path, manifest: dict, console, named: tuple = ()) -> tuple:
    """One warning line for each run of the sweep (but those in `named`, said already) that started from
    other weights than the sweep's other runs of its model (rundir/starts.py: another machine's warm
    start); the names said."""
    starts = {}
    for run in manifest["runs"]:
        try:
            starts[run["run_dir"]] = recorded_start(read_status(Path(sweep_dir) / run["run_dir"]))
        except DamagedFile:   # refused before this where it matters; here: nothing recorded
            starts[run["run_dir"]] = None
    others = [other for other in other_starts(starts) if other.run not in named]
    for other in others:
        console.print(f"warning: {other.run}: {other.why}; the report leaves it out, never averaged (share the "
                      "model cache between machines: docs/slurm.md)", markup=False, highlight=False)
    return tuple(named) + tuple(other.run for other in others)


def _runs_to_resume(sweep_dir: Path, manifest: dict, rerun: tuple) -> tuple[list[dict], dict]:
    """The runs of `manifest` still to run and each run's status (None: none yet or rerun), refused
    when one is still being trained, holds another config than planned or composes differently now."""
    check_own_runs(sweep_dir, manifest, rerun)
    todo, changed, statuses = [], [], {}
    for run in manifest["runs"]:
        run_dir = sweep_dir / run["run_dir"]
        try:
            status = None if run["run_dir"] in rerun or not run_dir.exists() else read_status(run_dir)
        except DamagedFile as err:
            raise _damaged_run(sweep_dir, run, err) from None
        statuses[run["run_dir"]] = status
        if status is not None and status.get("config_hash") != run["config_hash"]:
            changed.append(run["run_dir"])
        elif status is not None and status["state"] in FINISHED:
            continue                                   # a result: never rewritten
        else:
            todo.append(run)
    alive = [run["run_dir"] for run in todo if still_running(sweep_dir / run["run_dir"])]
    if alive:
        raise SweepError(f"{', '.join(alive[:3])}{', ...' if len(alive) > 3 else ''} is still being trained by "
                         "a live process on this machine (an earlier launch of this sweep); wait for it "
                         "or stop it before resuming")
    if changed:
        raise SweepError(f"{len(changed)} run(s) in {sweep_dir} hold a different config than the manifest "
                         f"({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''}); a sweep is only "
                         "resumed with the config it was started with")
    stale = [run["run_dir"] for run in todo
             if not run.get("deferred") and composed_hash(run["overrides"]) != run["config_hash"]]
    if stale:
        raise SweepError(f"the config of {', '.join(stale[:3])} composes differently now than when the sweep "
                         "started (the code or conf/ changed); start a new sweep")
    return todo, statuses


def check_own_runs(sweep_dir: Path, manifest: dict, rerun: tuple = ()) -> None:
    """A sweep trains in, rewrites and adopts only run dirs it created: inside its sweep dir (a
    link out of it counts as out), and, where the run recorded its overrides, launched by this
    sweep (`sweep.id`). One named in `rerun` is set aside whoever made it."""
    ours = manifest.get("sweep_id")
    for run in manifest["runs"]:
        run_dir = confined_dir(Path(sweep_dir) / run["run_dir"], "run dir", sweep_dir)
        try:
            recorded = sweep_id_of(read_overrides(run_dir) or []) if run_dir.is_dir() else None
        except DamagedFile as err:
            raise _damaged_run(sweep_dir, run, err) from None
        if recorded is not None and recorded != ours and run["run_dir"] not in rerun:
            raise SweepError(f"run {run['run_dir']} in {sweep_dir} is another sweep's (sweep.id={recorded}; this "
                             f"sweep is {ours}): a sweep resumes only runs it created; move it out, or rerun it "
                             f"here with `grpo-ablate sweep --resume {sweep_dir} --rerun {run['run_dir']}` "
                             "(it is set aside)")


def _damaged_run(sweep_dir: Path, run: dict, err: DamagedFile) -> SweepError:
    return SweepError(f"run {run['run_dir']}: {err.path.name} {err.problem}; re-run it with "
                      f"`grpo-ablate sweep --resume {sweep_dir} --rerun {run['run_dir']}`")


def _set_aside_failed(sweep_dir: Path, todo: list[dict], statuses: dict, rerun: tuple, console) -> None:
    """A failed run starts over, and one named in `rerun`: its dir is kept aside, never deleted."""
    for run in todo:
        run_dir, status = sweep_dir / run["run_dir"], statuses[run["run_dir"]]
        asked = run["run_dir"] in rerun and run_dir.exists()
        if asked or status is not None and status["state"] == "failed":
            stamp = time.strftime("%Y%m%d-%H%M%S")
            aside = sweep_dir / (".rerun" if asked else ".failed") / f"{run['run_dir']}.{stamp}"
            aside.parent.mkdir(exist_ok=True)
            os.rename(run_dir, aside)
            why = "rerun as asked" if asked else f"had failed ({status.get('reason')})"
            console.print(f"{run['run_dir']} {why}; rerunning it (old run kept in {aside})",
                          markup=False, highlight=False)


def still_running(run_dir: Path) -> bool:
    """A run whose status says running and whose writer process is alive on this host (a
    parallel worker can outlive a killed sweep process; two writers must never share a dir)."""
    import socket

    status = read_status(run_dir) if run_dir.exists() else None
    if not status or status["state"] != "running" or status.get("host") != socket.gethostname():
        return False
    try:
        pid = int(status["pid"])
        os.kill(pid, 0)
        command = Path(f"/proc/{pid}/cmdline").read_bytes() if Path("/proc").exists() else b"python"
    except (OSError, TypeError, KeyError, ValueError):
        return False
    return pid != os.getpid() and b"python" in command   # not a recycled pid of something else


def run_jobs(sweep_dir: Path, manifest: dict, todo: list[dict], launcher: str, jobs: int | None,
             hydra_args: list[str], console, resume: bool = False) -> int:
    """Launch `todo` (runs of the manifest) through Hydra, record how each ended, print the summary;
    0 when every run of the sweep finished (completed or diverged). Shared by start, resume and
    the sequential sweep's looks."""
    try:
        outcomes = _launch_now_and_later(sweep_dir, manifest, todo, launcher, jobs, hydra_args, console, resume)
    except (KeyboardInterrupt, RunInterrupted) as stop:   # each run records `interrupted` itself; so does the sweep
        signum = getattr(stop, "signum", signal.SIGINT)
        refresh_statuses(sweep_dir, manifest)
        write_manifest(sweep_dir, manifest)
        how = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        console.print(f"stopped ({how}): `grpo-ablate sweep --resume {sweep_dir}` continues it (interrupted runs "
                      "from their checkpoints)", markup=False, highlight=False)
        return STOPPED + signum   # as a shell reports a process the signal ended: 130 for Ctrl-C, 143 for SIGTERM
    refresh_statuses(sweep_dir, manifest, outcomes)
    write_manifest(sweep_dir, manifest)
    print_summary(manifest, console, sweep_dir)
    return 0 if all(run["status"] in FINISHED for run in manifest["runs"]) else 1


def _launch_now_and_later(sweep_dir: Path, manifest: dict, todo: list[dict], launcher: str, jobs: int | None,
                          hydra_args: list[str], console, resume: bool) -> dict:
    """The runs that can start now, then the SFT controls that wait for the treatments' time."""
    outcomes: dict = {}
    now = [run for run in todo if not run.get("deferred")]
    later = [run for run in todo if run.get("deferred")]
    if now:
        _warm_start(now, console)
        outcomes.update(_launch(sweep_dir, manifest, now, launcher, jobs, hydra_args, console, resume))
    if later:   # SFT controls on a wall-clock budget: the treatments' training time, known now
        refresh_statuses(sweep_dir, manifest, outcomes)
        context_of = {v.name: v.context for v in manifest_variants(manifest)}
        for run in later:   # the treatments of its own context (a sweep across contexts)
            wall_s = treatment_train_seconds(sweep_dir, manifest, context_of.get(run["variant"]))
            if wall_s is None:
                run.update(status="failed", reason="no completed treatment run to take the wall-clock "
                                                   "budget (control.budget=wall) from")
                continue
            run["overrides"] = run["overrides"] + [f"control.wall_s={max(wall_s, 0.1):.1f}"]
            run["config_hash"] = composed_hash(run["overrides"])
            del run["deferred"]
        later = [run for run in later if "deferred" not in run and run["status"] != "failed"]
        if later:
            budgets = sorted({o.split("=", 1)[1] for run in later for o in run["overrides"]
                              if o.startswith("control.wall_s=")}, key=float)
            console.print(f"SFT control budget: {', '.join(budgets)} s of training (the median of the treatment "
                          f"runs{' of each context' if any(context_of.values()) else ''})",
                          markup=False, highlight=False)
            outcomes.update(_launch(sweep_dir, manifest, later, launcher, jobs, hydra_args, console, resume))
    return outcomes


def treatment_train_seconds(sweep_dir: Path, manifest: dict, context: str | None = None) -> float | None:
    """Median training time (the sum of time/step_s: eval excluded) of the completed treatment runs
    (of `context`, in a sweep across contexts)."""
    treatments = {v.name for v in manifest_variants(manifest)
                  if v.kind == "treatment" and (context is None or v.context == context)}
    seconds = [sum(r.get("time/step_s") or 0.0 for r in read_rows(Path(sweep_dir) / run["run_dir"] / "metrics.jsonl"))
               for run in manifest["runs"] if run["variant"] in treatments and run["status"] == "completed"]
    return statistics.median(seconds) if seconds else None


def _launch(sweep_dir: Path, manifest: dict, todo: list[dict], launcher: str, jobs: int | None,
            hydra_args: list[str], console, resume: bool) -> dict:
    """One batch of runs through Hydra's launcher; returns how each job ended."""
    n_parallel = _parallel(launcher, jobs, len(todo))
    threads = _thread_share(manifest, launcher, jobs, manifest["runs"] if resume else todo)
    launch_dir = sweep_dir / ".launch"
    launch_dir.mkdir(exist_ok=True)
    jobs_file, results_file = launch_dir / "jobs.json", launch_dir / "results.json"
    job_list = [{"name": run["run_dir"],
                 "overrides": _with_threads(run["overrides"], threads) + (["resume=true"] if resume else [])}
                for run in todo]
    atomic_write_text(jobs_file, json.dumps(job_list, indent=2) + "\n")
    results_file.unlink(missing_ok=True)
    args = ["-m", "hydra/sweeper=grpo_ablate", f"hydra.sweeper.jobs_file={hydra_quoted(jobs_file)}",
            f"hydra.sweeper.results_file={hydra_quoted(results_file)}",
            f"hydra/launcher={LAUNCHERS[launcher][0]}", f"hydra.sweep.dir={hydra_quoted(sweep_dir)}",
            "hydra/hydra_logging=disabled"]
    if launcher == "basic":
        args.append("hydra.sweeper.max_batch_size=1")     # record each run as it ends
    elif launcher == "joblib":
        args.append(f"hydra.launcher.n_jobs={n_parallel}")
    elif launcher == "submitit_local":                    # it starts every job it is given at once
        args += [f"hydra.sweeper.max_batch_size={n_parallel}", f"hydra.launcher.cpus_per_task={threads}"]
    elif launcher == "submitit_slurm":
        if jobs:                                          # one job array, at most --jobs running
            args.append(f"hydra.launcher.array_parallelism={jobs}")
        from grpo_ablate.sweep.slurm import watch_jobs_without_sacct   # submitit: only for a cluster's sweep

        watch_jobs_without_sacct()                        # no accounting: job states from squeue
    manifest["launcher"] = launcher
    for run in todo:
        run["status"] = "launched"
    write_manifest(sweep_dir, manifest)
    fixed = next((o.split("=", 1)[1] for o in todo[0]["overrides"] if o.startswith("threads=")), None)
    shown = fixed or threads                              # the user's threads= wins over the share
    share = f", {shown} thread{'s' if str(shown) != '1' else ''} each" if shown else ""
    console.print(f"launching {len(todo)} run{'s' if len(todo) > 1 else ''} with the {launcher} launcher "
                  f"({n_parallel} at a time{share})", markup=False, highlight=False)
    from hydra_plugins.grpo_ablate_sweeper.grpo_ablate_sweeper import register

    register()
    from grpo_ablate.train import entrypoint  # the training stack (torch, transformers): only once runs start
    if launcher in WORKER_LAUNCHERS:   # a stop reaches the runs in their workers, and no worker outlives the sweep
        with stop_workers_on_signals(lambda: any(still_running(sweep_dir / run["run_dir"]) for run in todo)):
            entrypoint.run_hydra(args + list(hydra_args))
    else:                              # basic: the run in this process records its stop itself
        entrypoint.run_hydra(args + list(hydra_args))
    return json.loads(results_file.read_text()) if results_file.exists() else {}


def _parallel(launcher: str, jobs: int | None, n_runs: int) -> int:
    """How many of `n_runs` run at once: one with basic, --jobs (at most the cores, locally) otherwise."""
    if launcher == "basic":
        return 1
    return max(1, min(jobs or (cpus() if launcher in LOCAL_LAUNCHERS else n_runs), n_runs))


def _thread_share(manifest: dict, launcher: str, jobs: int | None, planned: list[dict]) -> int | None:
    """Each local run's share of the cores nobody else is using (rundir/cores.py: parallel runs never
    oversubscribe the machine, nor a machine already busy; on a cluster each job has its own), fixed by
    the sweep's first launch and recorded in the manifest: a run resumed later, when fewer runs are
    left, trains with the threads it started with, so its metrics are the uninterrupted sweep's bit for
    bit. A manifest from before the share was recorded: the share its start gave, from all its runs
    (`planned`)."""
    if launcher not in LOCAL_LAUNCHERS:
        return None
    if not isinstance(manifest.get("threads"), int):
        manifest["threads"] = max(1, free_cores() // _parallel(launcher, jobs, len(planned)))
    return manifest["threads"]


def _with_threads(overrides: list[str], threads: int | None) -> list[str]:
    """The launcher's thread share, unless the user fixed `threads=` for the sweep."""
    if threads is None or any(o.startswith("threads=") for o in overrides):
        return list(overrides)
    return list(overrides) + [f"threads={threads}"]


def _warm_start(todo: list[dict], console) -> None:
    """Build each distinct embedded model (and convert each GGUF file) once, here, before parallel runs
    would race to, on the cores nobody else is using (another command building the same entry is
    waited for: models.built_once)."""
    import torch   # the training stack: only once runs start

    from grpo_ablate.models import ensure_warm_started, model_dir
    torch.set_num_threads(cpu_threads(None))
    seen = set()
    for run in todo:
        cfg = compose_run(list(run["overrides"]), f"run {run['run_dir']}")
        if gguf_source(cfg.model) is not None:   # a GGUF model: converted once (cached by its bytes)
            model_dir(cfg.model, log=lambda m: console.print(m, markup=False, highlight=False))
            continue
        if cfg.model.get("path"):
            continue
        key = json.dumps([_container(cfg.model), _container(cfg.task)], sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            ensure_warm_started(cfg.model, build_task(cfg.task),
                                log=lambda m: console.print(m, markup=False, highlight=False))


def _container(node):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True)


def check_launcher(launcher: str, jobs: int | None) -> None:
    """SweepError unless `launcher` is known, its plugin installed and `jobs` fits it."""
    if launcher not in LAUNCHERS:
        raise SweepError(f"--launcher {launcher} is not allowed; allowed: {', '.join(LAUNCHERS)}")
    _, module, extra = LAUNCHERS[launcher]
    if module and importlib.util.find_spec(module) is None:
        raise SweepError(f"--launcher {launcher} needs its Hydra plugin: pip install '{extra}'")
    if jobs is not None and jobs < 1:
        raise SweepError(f"--jobs {jobs} is not allowed; it must be >= 1")
    if jobs is not None and jobs > 1 and launcher == "basic":
        raise SweepError("--jobs > 1 needs a parallel launcher (joblib, submitit_local, ...); "
                         "basic runs one job at a time")

