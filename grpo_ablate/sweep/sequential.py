"""`grpo-ablate sweep ... --seeds auto`: seeds until decided, one look at a time.

After each look every contrast is decided by stats/group_sequential.py's rule (or by breaking
training / being inert here); the next seed goes to both sides of every open contrast, until all
are decided or --max-seeds / --budget is reached. Each look is in the manifest before its runs
start; `decide_look` reads only the sweep dir. Design: docs/seeds-auto.md
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from grpo_ablate.stats import group_sequential as seq
from grpo_ablate.report.activity import activity_of
from grpo_ablate.report.curves import Summary
from grpo_ablate.report.health import Flag, HealthThresholds
from grpo_ablate.report.load import Run, load_run, metrics_frame, nonfinite_steps
from grpo_ablate.report.power import plan_of
from grpo_ablate.stats.intervals import Estimate
from grpo_ablate.report.verdicts import BREAKS_TRAINING, INERT, decide, inertness
from grpo_ablate.rundir.files import read_rows, read_status
from grpo_ablate.rundir.lock import DirLock
from grpo_ablate.sweep.console import contexts_text, print_matrix, print_pair_rules
from grpo_ablate.sweep.launch import STOPPED, check_launcher, check_own_runs, run_jobs
from grpo_ablate.sweep.launch import resume as resume_fixed
from grpo_ablate.sweep.manifest import FINISHED, MANIFEST, create_sweep_dir, read_manifest, timestamp, write_manifest
from grpo_ablate.sweep.controls import control_in
from grpo_ablate.design import manifest_variants
from grpo_ablate.sweep.matrix import Matrix, SweepError, expand_jobs
from grpo_ablate.sweep.plan import DECISION_SUMMARY, SweepRequest, pin_planned_eval, run_entry
from grpo_ablate.sweep.plan import plan as plan_fixed
from grpo_ablate.sweep.sequential_console import UNDECIDED, look_text, planner_text, print_decisions, say

METRIC = "eval/accuracy"          # what the report decides on by default; higher is better


@dataclass
class Options:
    """What `--seeds auto` was given."""
    max_seeds: int = seq.MAX_SEEDS
    budget_s: float | None = None
    effect: float | None = None
    initial_seeds: int = seq.INITIAL_SEEDS
    summary: str = DECISION_SUMMARY   # what each look compares (report/curves.py), as its label


def parse_duration(text) -> float:
    """`90m`, `2h`, `1h30m`, `45s` or plain seconds -> seconds."""
    value = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        seconds = float(value)
    else:
        parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", value)
        if not value or not parts or not any(parts.groups()):
            raise SweepError(f"--budget {text!r} is not a duration; give e.g. 90m, 2h, 1h30m or 600s")
        hours, minutes, secs = (float(g or 0) for g in parts.groups())
        seconds = hours * 3600 + minutes * 60 + secs
    if seconds <= 0:
        raise SweepError(f"--budget {text!r} must be longer than zero")
    return seconds


def options_from(given: dict) -> Options:
    """--max-seeds, --budget, --effect (or a sweep file's max_seeds, budget, effect) as Options."""
    options = Options()
    if given.get("max_seeds") is not None:
        options.max_seeds = int(given["max_seeds"])
    if given.get("budget") is not None:
        options.budget_s = parse_duration(given["budget"])
    if given.get("effect") is not None:
        options.effect = float(given["effect"])
    if given.get("summary") is not None:
        try:
            options.summary = Summary.parse(str(given["summary"])).label
        except ValueError as err:
            raise SweepError(f"--summary: {err}") from None
    check_options(options)
    return options


def resume_any(sweep_dir: Path, launcher, jobs, hydra_args, console, given: dict, rerun: tuple = ()) -> int:
    """`sweep --resume`: a sequential sweep goes on looking (with a new --max-seeds or --budget
    if given); a fixed one is resumed as before. `rerun`: runs started over (their dirs kept aside)."""
    manifest = read_manifest(sweep_dir)
    with DirLock(sweep_dir, "sweep dir", lambda text: say(console, text)):   # one process a sweep dir
        return _resume_any(sweep_dir, manifest, launcher, jobs, hydra_args, console, given, rerun)


def _resume_any(sweep_dir: Path, manifest: dict, launcher, jobs, hydra_args, console, given: dict,
                rerun: tuple) -> int:
    if "sequential" not in manifest:
        if any(v is not None for v in given.values()):
            raise SweepError(f"--max-seeds and --budget continue a sequential sweep (--seeds auto); {sweep_dir} "
                             "ran a fixed set of seeds")
        return resume_fixed(sweep_dir, launcher, jobs, hydra_args, console, rerun)
    if not isinstance(manifest["sequential"], dict) or not isinstance(manifest["sequential"].get("looks"), list):
        raise SweepError(f"{Path(sweep_dir) / MANIFEST} is damaged (its sequential section has no looks); "
                         "the sweep cannot be resumed from it: restore it or start a new sweep")
    budget = parse_duration(given["budget"]) if given.get("budget") is not None else None
    return resume(sweep_dir, launcher, jobs, hydra_args, console, given.get("max_seeds"), budget, rerun)


def check_options(options: Options) -> seq.Plan:
    if options.max_seeds < options.initial_seeds:
        raise SweepError(f"--max-seeds {options.max_seeds} is below the {options.initial_seeds} initial seeds "
                         "of --seeds auto")
    if options.effect is not None and not options.effect > 0:
        raise SweepError(f"--effect {options.effect} must be > 0 (the smallest Δ {METRIC} that matters)")
    return seq.Plan(initial_seeds=options.initial_seeds, max_seeds=options.max_seeds, effect=options.effect)


# ------------------------------------------------------------------------------ planning
def plan(req: SweepRequest, options: Options) -> dict:
    """The manifest of a new sequential sweep: look 1 at the initial seeds, planned to the max."""
    check_options(options)
    cap = req.max_runs
    req.seeds, req.max_runs = str(options.initial_seeds), 10 ** 6
    manifest = plan_fixed(req)
    req.max_runs = cap
    most = len(manifest["variants"]) * options.max_seeds
    if most > cap:
        raise SweepError(f"this sequential sweep may grow to {len(manifest['variants'])} variants x "
                         f"{options.max_seeds} seeds = {most} runs, above the limit of {cap}; raise it with "
                         f"--max-runs {most}, lower --max-seeds or sweep fewer tricks")
    manifest["sequential"] = {
        "initial_seeds": options.initial_seeds, "max_seeds": options.max_seeds, "budget_s": options.budget_s,
        "effect": options.effect, "metric": METRIC, "summary": options.summary, "higher_is_better": True,
        "alpha": seq.ALPHA,
        "spending": "obrien-fleming", "elapsed_s": 0.0, "stopped": None,
        "looks": [_look_record(1, None, [r["run_dir"] for r in manifest["runs"]], options.max_seeds)]}
    contrasts = contrasts_of(manifest)
    if not contrasts:
        raise SweepError("--seeds auto decides contrasts, and this sweep has none (no pair of variants that "
                         "differ by one trick, no control); give a seed count instead")
    # the sweep's alpha is split over each family before the first run (report/power.contrast_alpha)
    manifest["sequential"]["families"] = {kind: sum(c["kind"] == kind for c in contrasts)
                                          for kind in ("trick", "control")}
    return manifest


def _look_record(number: int, seed, runs: list[str], max_seeds: int) -> dict:
    return {"look": number, "seed": seed, "runs": runs, "max_seeds": max_seeds, "wall_s": None,
            "seeds": None, "decisions": None}


def contrasts_of(manifest: dict) -> list[dict]:
    """Trick contrasts (two-sided) and every treatment against every control (one-sided)."""
    out = [{"name": c["trick"], "kind": "trick", "with": c["with"], "without": c["without"],
            **({"context": c["context"], "tests": c["tests"]} if c.get("context") else {})}
           for c in manifest.get("contrasts") or []]
    variants = manifest_variants(manifest)
    controls, names = manifest.get("controls") or {}, {v.name for v in variants}
    for v in variants:
        if v.kind == "control":
            continue
        for role in controls:   # the control of the variant's own context (sweep/controls.py)
            control = control_in(controls, role, v.context)
            if control in names:
                out.append({"name": f"{v.name} vs {control}", "kind": "control", "role": role,
                            "with": v.name, "without": control})
    return out


# ------------------------------------------------------------------------------ deciding (reads the dir)
def read_finals(sweep_dir: Path, manifest: dict, metric: str, summary: str = "final") -> tuple[dict, dict]:
    """({variant: {seed: the summary of the metric of a completed run}}, {variant: [(seed, run dir,
    state, status)]}). `summary`: a label of report/curves.py (final when the manifest predates them)."""
    how = Summary.parse(summary)
    finals, runs = {}, {}
    for entry in manifest["runs"]:
        run_dir = Path(sweep_dir) / entry["run_dir"]
        status = read_status(run_dir) if run_dir.exists() else None
        state = status["state"] if status else "missing"
        runs.setdefault(entry["variant"], []).append((entry["seed"], run_dir, state, status))
        finals.setdefault(entry["variant"], {})
        if state == "completed":
            rows = read_rows(run_dir / "metrics.jsonl")
            value = None if metric in nonfinite_steps(rows) else how(metrics_frame(rows), metric)   # NaN: no number
            if value is not None:
                finals[entry["variant"]][entry["seed"]] = float(value)
    return finals, runs


def decide_look(sweep_dir: Path, manifest: dict) -> list[dict]:
    """Every contrast's decision at the manifest's last look, from the run dirs. A contrast
    decided at an earlier look keeps that decision."""
    section = manifest["sequential"]
    plans = {kind: plan_of(section, section["effect"], kind) for kind in ("trick", "control")}
    finals, runs = read_finals(sweep_dir, manifest, section["metric"], section.get("summary", "final"))
    earlier = [look["decisions"] for look in section["looks"][:-1] if look["decisions"]]
    decisions = []
    for contrast in contrasts_of(manifest):
        past = [d for ds in earlier for d in ds if d["name"] == contrast["name"]]
        if past and past[-1]["outcome"] != UNDECIDED:
            decisions.append(dict(past[-1]))
            continue
        decisions.append(_decide_contrast(contrast, past, finals, runs, plans[contrast["kind"]], section))
    return decisions


def _decide_contrast(contrast, past, finals, runs, plan, section) -> dict:
    look_number = len(section["looks"])
    with_, without = contrast["with"], contrast["without"]
    two_sided = contrast["kind"] == "trick"
    sign = 1.0 if section["higher_is_better"] else -1.0     # the one-sided test is on "better"
    current = seq.paired_look({s: sign * v for s, v in finals.get(with_, {}).items()},
                              {s: sign * v for s, v in finals.get(without, {}).items()}, section["max_seeds"])
    record = {**contrast, "n": current.n if current else 0, "mean": current.mean * sign if current else None,
              "sd": current.sd if current else None, "outcome": UNDECIDED, "decided_at_look": None}
    broke = _breaks_training(runs.get(with_, []), runs.get(without, []), with_, without, section["higher_is_better"])
    if broke:
        return {**record, "outcome": BREAKS_TRAINING, "decided_at_look": look_number, "why": broke}
    # at its first look only: sides that differ at a seed differ for good, activity once seen stays seen
    inert = (_inert(runs.get(with_, []), runs.get(without, []), with_, without, contrast.get("tests", contrast["name"]),
                    finals)
             if two_sided and not past else None)
    if inert:     # more seeds cannot decide a trick that changed nothing
        return {**record, "outcome": INERT, "decided_at_look": look_number, "why": inert}
    history = [seq.Look(d["n"], d["max_seeds"], d["mean"] * sign, d["sd"]) for d in past if d["mean"] is not None]
    if current is None:
        return {**record, "why": "no seed with completed runs on both sides yet"}
    if current.n >= 2 and current.sd == 0.0:
        record["why"] = ("every seed gave the same Δ: no spread to test against (a coarse metric? more eval "
                         "problems)")
    decision = seq.decide(history + [current], plan, two_sided)
    names = ({seq.POSITIVE: "helps" if sign > 0 else "hurts", seq.NEGATIVE: "hurts" if sign > 0 else "helps"}
             if two_sided else {seq.POSITIVE: "beats", seq.NEGATIVE: "worse"})
    names[seq.EQUIVALENT] = f"no effect >= {plan.effect:g}" if plan.effect else UNDECIDED
    outcome = names.get(decision.outcome, UNDECIDED)
    return {**record, "max_seeds": current.max_seeds, "t": _finite(decision.t), "boundary": _finite(decision.boundary),
            "alpha_spent": decision.alpha_spent, "final": decision.final, "replanned": decision.replanned,
            "rci": [_finite(x) for x in decision.rci], "outcome": outcome,
            "decided_at_look": look_number if outcome != UNDECIDED else None,
            **_power(current, decision, plan, two_sided)}


def _breaks_training(with_runs, without_runs, with_, without, higher_is_better) -> str | None:
    """The report's *breaks training* rule on the runs' states (status.json: diverged); the
    health flags of completed runs are the report's to read, they do not stop seeding."""
    if not any(state == "diverged" for _, _, state, _ in with_runs):
        return None

    def as_runs(variant, runs):
        return [Run(variant, seed, run_dir, state=state, flags=[
            Flag("diverged", int(status.get("step") or 0), status.get("reason") or "diverged")]
            if state == "diverged" else []) for seed, run_dir, state, status in runs]

    verdict, why = decide(as_runs(with_, with_runs), as_runs(without, without_runs), Estimate(), higher_is_better)
    return why if verdict == BREAKS_TRAINING else None


def _inert(with_runs, without_runs, with_, without, trick, finals) -> str | None:
    """The report's *inert here* rule (identical sides at every shared seed, or no activity),
    reading the runs only when it could hold: equal final values at every shared seed, or a
    trick that has an activity metric."""
    left, right = finals.get(with_, {}), finals.get(without, {})
    identical_possible = all(left[s] == right[s] for s in set(left) & set(right))
    configs = [read_yaml(run_dir / "config.yaml") for _, run_dir, state, _ in with_runs if state == "completed"]
    info = [((c.get("tricks") or {}).get(trick) or {}) for c in configs if isinstance(c, dict)]
    has_activity = any(activity_of(i.get("family"), i.get("option")) for i in info if isinstance(i, dict))
    if not (identical_possible or has_activity):
        return None
    load = lambda variant, runs: [load_run(run_dir, variant, seed, HealthThresholds()) for seed, run_dir, _, _ in runs]
    return inertness(load(with_, with_runs), load(without, without_runs), trick)


def read_yaml(path: Path):
    try:
        return yaml.safe_load(path.read_text()) if path.exists() else None
    except (OSError, yaml.YAMLError):
        return None


def _power(look: seq.Look, decision: seq.Decision, plan: seq.Plan, two_sided: bool) -> dict:
    """For an open contrast: the smallest |Δ| these seeds detect with 80% power under the
    look's boundary, and about how many seeds (fixed design, 5%) an effect of the estimate's
    size (or of --effect) needs."""
    if decision.outcome != seq.UNDECIDED or look.n < 2 or not look.sd > 0:
        return {"detectable_effect": None, "seeds_needed": None}
    critical = decision.boundary if math.isfinite(decision.boundary) else None
    target = plan.effect if plan.effect else abs(look.mean)
    # a one-sided test at alpha / 2 needs the seeds of a two-sided one at alpha
    return {"detectable_effect": seq.detectable_effect(look.sd, look.n, critical=critical),
            "seeds_needed": seq.seeds_needed(target, look.sd, level=plan.alpha), "seeds_needed_for": target}


def _finite(x):
    return None if x is None or not math.isfinite(x) else float(x)


# ------------------------------------------------------------------------------ the next look
def seeds_of(manifest: dict) -> dict:
    """variant -> its seeds in the manifest (started or not)."""
    out = {v.name: [] for v in manifest_variants(manifest)}
    for r in manifest["runs"]:
        out.setdefault(r["variant"], []).append(r["seed"])
    return out


def record_decisions(manifest: dict, decisions: list[dict]) -> None:
    manifest["sequential"]["looks"][-1].update(decisions=decisions, seeds=seeds_of(manifest))


def needed_variants(manifest: dict) -> list[str]:
    """The variants of every contrast still open at the last look and not at its cap."""
    section = manifest["sequential"]
    have = seeds_of(manifest)
    needed = set()
    for d in section["looks"][-1]["decisions"] or []:
        if d["outcome"] == UNDECIDED and min(len(have[d["with"]]), len(have[d["without"]])) < section["max_seeds"]:
            needed |= {d["with"], d["without"]}
    return [v.name for v in manifest_variants(manifest) if v.name in needed]


def stopping_reason(manifest: dict, next_runs: int) -> str | None:
    """Why no further look starts: all decided, max seeds, budget; None to go on."""
    section = manifest["sequential"]
    decisions = section["looks"][-1]["decisions"] or []
    if all(d["outcome"] != UNDECIDED for d in decisions):
        return "all decided"
    if next_runs == 0:
        return "max seeds"
    if section.get("budget_s"):
        last = section["looks"][-1]
        per_run = (last["wall_s"] or 0.0) / max(1, len(last["runs"]))
        if section["elapsed_s"] + per_run * next_runs > section["budget_s"]:
            return "budget"
    return None


def add_look(manifest: dict, make_entry=None) -> list[dict]:
    """Append the next look: one new seed for every needed variant, its runs pending. Returns them."""
    variants = needed_variants(manifest)
    seed = max(r["seed"] for r in manifest["runs"]) + 1
    labels = {"name": manifest["name"], "id": manifest["sweep_id"], "group": manifest["wandb_group"],
              "tricks": list(manifest.get("tricks") or [])}
    matrix = Matrix(manifest["mode"], [v for v in manifest_variants(manifest) if v.name in variants], [])
    entries = [(make_entry or run_entry)(job)
               for job in expand_jobs(matrix, [seed], list(manifest["overrides"]), labels)]
    manifest["runs"] += entries
    manifest["seeds"] = sorted(set(manifest["seeds"]) | {seed})
    section = manifest["sequential"]
    section["looks"].append(_look_record(len(section["looks"]) + 1, seed, [e["run_dir"] for e in entries],
                                         section["max_seeds"]))
    return entries


# ------------------------------------------------------------------------------ running
def start(req: SweepRequest, options: Options, console, dry_run: bool = False) -> int:
    check_launcher(req.launcher, req.jobs)
    manifest = plan(req, options)
    if dry_run:
        print_matrix(manifest, console)
        say(console, planner_text(manifest, req))
        if manifest.get("contexts"):
            say(console, contexts_text(manifest, req, wall=False))   # look 1's runs per context
        return 0
    sweep_dir = create_sweep_dir(req, manifest)
    say(console, f"sequential sweep {manifest['name']}: look 1 = {len(manifest['variants'])} variants x "
                  f"{options.initial_seeds} seeds = {len(manifest['runs'])} runs, then one seed per look for "
                  f"the contrasts still open, up to {options.max_seeds} seeds -> {sweep_dir}")
    print_pair_rules(manifest, console)
    with DirLock(sweep_dir, "sweep dir"):
        return run_looks(sweep_dir, manifest, req.launcher, req.jobs, req.hydra_args, console)


def resume(sweep_dir: Path, launcher, jobs, hydra_args, console, max_seeds: int | None = None,
           budget_s: float | None = None, rerun: tuple = ()) -> int:
    """Finish the current look (finished runs are kept), then go on; a larger --max-seeds or a
    new --budget continues a sweep that had stopped at its cap. A stopped sweep with nothing
    new to do is only printed: nothing is written."""
    sweep_dir = Path(sweep_dir)
    manifest = read_manifest(sweep_dir)
    check_own_runs(sweep_dir, manifest, rerun)   # a look decides only on runs this sweep made
    pin_planned_eval(manifest)                   # planned when greedy was the only eval: it goes on greedy
    section = manifest["sequential"]
    unfinished = [r for r in manifest["runs"] if r["status"] not in FINISHED or r["run_dir"] in rerun]
    if section.get("stopped") and max_seeds is None and budget_s is None and not unfinished:
        say(console, f"{sweep_dir} stopped at look {section['stopped'].get('at_look')} "
                      f"({section['stopped'].get('reason')}); nothing to do")
        print_decisions(manifest, console)
        return 0
    if max_seeds is not None:
        most = max(len(s) for s in seeds_of(manifest).values())
        if max_seeds < most:
            raise SweepError(f"--max-seeds {max_seeds} is below the {most} seeds this sweep already ran")
        section["max_seeds"] = max_seeds
        if section["looks"][-1]["decisions"] is None:      # the unfinished look is decided on the new horizon
            section["looks"][-1]["max_seeds"] = max_seeds
    if budget_s is not None:
        section["budget_s"] = budget_s
    if section.get("stopped") and (max_seeds is not None or budget_s is not None):
        section["stopped"] = None                      # a new cap: look again
    write_manifest(sweep_dir, manifest)
    launcher = launcher or manifest.get("launcher", "joblib")
    if unfinished:
        started = time.monotonic()
        code = resume_fixed(sweep_dir, launcher, jobs, hydra_args, console, rerun)
        manifest = read_manifest(sweep_dir)
        _add_time(manifest["sequential"], time.monotonic() - started)
        write_manifest(sweep_dir, manifest)
        if code >= STOPPED:   # stopped again: the next --resume goes on from here
            return code
    return run_looks(sweep_dir, manifest, launcher, jobs, hydra_args, console)


def run_looks(sweep_dir: Path, manifest: dict, launcher, jobs, hydra_args, console) -> int:
    """The look loop: launch the look's unfinished runs, decide, record, stop or add a look."""
    section = manifest["sequential"]
    while not section.get("stopped"):
        look = section["looks"][-1]
        if look["decisions"] is None:
            # a failed run is this look's result (its seed has no pair); `--resume` reruns it
            todo = [r for r in manifest["runs"] if r["run_dir"] in set(look["runs"])
                    and r["status"] not in FINISHED + ("failed",)]
            if todo:
                started = time.monotonic()
                code = run_jobs(sweep_dir, manifest, todo, launcher, jobs, hydra_args, console)
                _add_time(section, time.monotonic() - started)
                if code >= STOPPED:   # stopped (Ctrl-C, SIGTERM): the look is decided once --resume finishes it
                    write_manifest(sweep_dir, manifest)
                    return code
            record_decisions(manifest, decide_look(sweep_dir, manifest))
            write_manifest(sweep_dir, manifest)
            say(console, look_text(manifest))
        reason = stopping_reason(manifest, len(needed_variants(manifest)))
        if reason:
            section["stopped"] = {"reason": reason, "at_look": len(section["looks"]), "at": timestamp()}
        else:
            add_look(manifest)
        write_manifest(sweep_dir, manifest)   # the new look's runs are listed before any starts
    print_decisions(manifest, console)
    broken = [r for r in manifest["runs"] if r["status"] not in FINISHED]
    return 1 if broken else 0


def _add_time(section: dict, seconds: float) -> None:
    """Launch time counts against --budget and, per run, estimates the next look."""
    section["elapsed_s"] = round(section["elapsed_s"] + seconds, 2)
    look = section["looks"][-1]
    look["wall_s"] = round((look["wall_s"] or 0.0) + seconds, 2)
