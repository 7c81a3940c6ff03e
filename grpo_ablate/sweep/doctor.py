"""`grpo-ablate doctor`: which trick breaks training? (the seed review's section 5)

All on; if it breaks, leave one out; then subsets, smallest first, for the smallest breaking sets.
`analyse` is a pure function of the outcomes so far; each stage it asks for is an ordinary sweep
in a subdirectory. Pruning assumes a trick can only add breakage (monotone): a trick whose removal
heals the all-on run is in every breaking set.
Design: docs/diagnostics.md#which-trick-breaks-training-grpo-ablate-doctor
"""
from __future__ import annotations

import itertools
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grpo_ablate import report as rep
from grpo_ablate.config.catalogue import load_catalogue
from grpo_ablate.sweep.requests import DoctorArgs, SweepArgs
from grpo_ablate.rundir.files import atomic_write_text
from grpo_ablate.rundir.paths import confined_dir
from grpo_ablate.sweep import launch
from grpo_ablate.sweep.command import sweep_request
from grpo_ablate.sweep.console import print_matrix, print_pair_rules
from grpo_ablate.sweep.launch import check_launcher
from grpo_ablate.sweep.manifest import MANIFEST, read_manifest
from grpo_ablate.design import Variant, manifest_variants
from grpo_ablate.sweep.matrix import Matrix, SweepError, check_exclusive, check_known, parse_seeds, trick_overrides
from grpo_ablate.sweep.plan import DEFAULT_BASE, DEFAULT_TRICKS, SweepRequest, plan


REQUEST = "doctor_request.json"
DEFAULT_STEPS = 30          # a short run: long enough for the health flags (patience 3) to fire
DEFAULT_SEEDS = "1"
DEFAULT_MAX_RUNS = 32       # the search stops (verdict "undetermined") rather than go past this
UNFINISHED = ("running", "missing")


# ------------------------------------------------------------------------------ the search (pure)
@dataclass(frozen=True)
class SetResult:
    """How a set of tricks did: broken if any of its runs broke. `runs`: the evidence."""
    broken: bool
    runs: tuple = ()      # {"run", "state", "step", "flags": [{"name", "step", "detail"}]}
    stage: str = ""


@dataclass
class Stage:
    kind: str                      # all-on | leave-one-out | base | size-<k>
    sets: list                     # the trick sets (frozensets) to run


@dataclass
class Analysis:
    next: Stage | None             # what to run next; None: the search is over
    minimal: list = field(default_factory=list)   # confirmed minimal breaking sets
    necessary: frozenset = frozenset()            # tricks whose removal heals the all-on run


def set_name(s: frozenset, tricks: list[str]) -> str:
    """A set's variant name, unique within a doctor run: all, drop-x, base, or a+b."""
    if len(s) == len(tricks):
        return "all"
    if not s:
        return "base"
    if len(s) == len(tricks) - 1 and len(tricks) > 2:
        return f"drop-{next(t for t in tricks if t not in s)}"
    return "+".join(t for t in tricks if t in s)


def _broken(outcomes) -> list[frozenset]:
    return [s for s, r in outcomes.items() if r.broken]


def minimal_breaking(outcomes, upto: int) -> list[frozenset]:
    """Broken sets of at most `upto` tricks none of whose tested subsets broke."""
    broken = _broken(outcomes)
    return sorted((s for s in broken if len(s) <= upto and not any(o < s for o in broken)),
                  key=lambda s: (len(s), sorted(s)))


def analyse(tricks: list[str], outcomes: dict) -> Analysis:
    """The next stage of the search given the outcomes so far (frozenset of tricks on ->
    SetResult), or None when it is over. Stages: the all-on run; if it broke, leave-one-out;
    then, level by level from the size of the necessary set (the tricks whose removal heals;
    from the bare base when there are none), every untested set that holds the necessary
    tricks and no smaller set already found to break — until every broken set seen so far
    contains a breaking set found at or below the level (the breakage is explained)."""
    T = frozenset(tricks)
    if T not in outcomes:
        return Analysis(Stage("all-on", [T]))
    if not outcomes[T].broken:
        return Analysis(None)
    loo = [T - {t} for t in tricks]
    todo = [s for s in loo if s not in outcomes]
    if todo:
        return Analysis(Stage("leave-one-out", todo))
    necessary = frozenset(t for t in tricks if not outcomes[T - {t}].broken)
    others = [t for t in tricks if t not in necessary]
    for k in range(len(necessary), len(T)):
        below = [s for s in _broken(outcomes) if len(s) < k]
        level = [necessary | frozenset(c) for c in itertools.combinations(others, k - len(necessary))]
        untested = [s for s in level if s not in outcomes and not any(b < s for b in below)]
        if untested:
            return Analysis(Stage("base" if k == 0 else f"size-{k}", untested), minimal_breaking(outcomes, k - 1),
                            necessary)
        minimal = minimal_breaking(outcomes, k)
        if all(any(m <= s for m in minimal) for s in _broken(outcomes)):
            return Analysis(None, minimal, necessary)
    return Analysis(None, minimal_breaking(outcomes, len(T)), necessary)


def verdicts(tricks: list[str], outcomes: dict, analysis: Analysis) -> list[dict]:
    """One verdict per trick: safe | breaks training alone | breaks training together with X |
    undetermined (the search stopped at its run budget) | not to blame (the bare base breaks),
    each with the sets (and their runs) that back it."""
    T = frozenset(tricks)
    done = analysis.next is None

    def evidence(s: frozenset, why: str) -> dict:
        r = outcomes[s]
        return {"set": set_name(s, tricks), "tricks_on": [t for t in tricks if t in s], "broken": r.broken,
                "stage": r.stage, "why": why, "runs": list(r.runs)}

    if T in outcomes and not outcomes[T].broken:
        return [{"trick": t, "verdict": "safe", "with": [],
                 "evidence": [evidence(T, "every trick on, the run stayed healthy")]} for t in tricks]
    out = []
    for t in tricks:
        if frozenset() in analysis.minimal:
            out.append({"trick": t, "verdict": "not to blame", "with": [],
                        "evidence": [evidence(frozenset(), "the base breaks with no trick on")]})
            continue
        mine = [s for s in analysis.minimal if t in s]
        if frozenset({t}) in mine:
            out.append({"trick": t, "verdict": "breaks training alone", "with": [],
                        "evidence": [evidence(frozenset({t}), "on its own, it broke")]})
            continue
        if mine:
            partners = [[u for u in tricks if u in s and u != t] for s in mine]
            ev = [evidence(s, "together, they broke") for s in mine]
            for s in mine:
                healthy = _healthy_without(s, t, outcomes)
                if healthy is not None:
                    ev.append(evidence(healthy, f"without {t}, the others of this set stayed healthy"))
            out.append({"trick": t, "verdict": "breaks training together with " + " / ".join(
                " + ".join(p) for p in partners), "with": partners, "evidence": ev})
            continue
        drop = T - {t}
        why = ("dropping it did not heal the all-on run" if outcomes.get(drop, SetResult(False)).broken
               else "dropping it healed the all-on run")
        ev = [evidence(drop, why)] if drop in outcomes else []
        if frozenset({t}) in outcomes:
            ev.append(evidence(frozenset({t}), "on its own, it stayed healthy"))
        out.append({"trick": t, "verdict": "safe" if done else "undetermined", "with": [], "evidence": ev})
    return out


def _healthy_without(s: frozenset, t: str, outcomes: dict) -> frozenset | None:
    """The smallest tested healthy set that holds s without t (and not t): the counterfactual."""
    rest = s - {t}
    fits = [o for o in outcomes if rest <= o and t not in o and not outcomes[o].broken]
    return min(fits, key=len) if fits else None


# ------------------------------------------------------------------------------ running it
@dataclass
class DoctorRequest:
    tricks: list[str]
    base: str | None = None
    steps: int = DEFAULT_STEPS
    seeds: str = DEFAULT_SEEDS
    overrides: list[str] = field(default_factory=list)
    hydra_args: list[str] = field(default_factory=list)
    launcher: str = "joblib"
    jobs: int | None = None
    max_runs: int = DEFAULT_MAX_RUNS
    thresholds: dict = field(default_factory=dict)
    group: str = ""
    allow_inert: bool = False      # search tricks that cannot act here (config/inert.py) anyway


def stage_matrix(stage: Stage, tricks: list[str]) -> Matrix:
    variants = [Variant(set_name(s, tricks), tuple(t for t in tricks if t in s),
                        trick_overrides([t for t in tricks if t in s])) for s in stage.sets]
    return Matrix("doctor", variants, [])


def stage_request(req: DoctorRequest, stage: Stage, stage_dir: Path | None):
    """The sweep request that runs one stage of the search (the CLI prints its plan too)."""
    return SweepRequest(mode="doctor", tricks=list(req.tricks), base=req.base, seeds=req.seeds,
                        overrides=list(req.overrides), hydra_args=list(req.hydra_args), launcher=req.launcher,
                        jobs=req.jobs, max_runs=10 ** 6, name=f"doctor-{stage.kind}", steps=req.steps,
                        sweep_dir=stage_dir, matrix=stage_matrix(stage, req.tricks), group=req.group or None,
                        allow_inert=req.allow_inert)


def check(req: DoctorRequest) -> None:
    """Everything that can be refused before a run starts: the trick list, the seeds, and that
    the all-on set, every leave-one-out set and the bare base compose (every other subset
    then composes too: subsets only leave tricks out)."""

    families = {row["name"]: row["family"] for row in load_catalogue()}
    if not req.tricks:
        raise SweepError("doctor needs tricks: --tricks a,b,c (see `grpo-ablate tricks`)")
    check_known(req.tricks, families)
    check_exclusive(req.tricks, families)
    parse_seeds(req.seeds)
    if req.steps < 1:
        raise SweepError(f"--steps {req.steps} is not allowed; it must be >= 1")
    check_launcher(req.launcher, req.jobs)
    if req.max_runs < len(parse_seeds(req.seeds)):
        raise SweepError(f"--max-runs {req.max_runs} leaves no room for the all-on run ({req.seeds} seeds)")
    T = frozenset(req.tricks)
    first = Stage("check", list(dict.fromkeys([T, frozenset(), *(T - {t} for t in req.tricks)])))
    plan(stage_request(req, first, None))


def read_stage(stage_dir: Path, tricks: list[str], thresholds) -> dict:
    """frozenset of tricks on -> SetResult, from a finished stage sweep dir (report's reader)."""
    sweep = rep.load_sweep(stage_dir, thresholds)
    out = {}
    for v in sweep.variants:
        runs = [r for r in sweep.runs if r.variant == v.name]
        evidence = []
        for r in runs:
            flags = [asdict(f) for f in r.flags if f.name in rep.BREAKING_FLAGS]
            if r.state == "failed":
                flags.append({"name": "failed", "step": r.step, "detail": r.reason or "the run crashed"})
            evidence.append({"run": f"{stage_dir.name}/{r.name}", "state": r.state, "step": r.step, "flags": flags})
        broken = any(r.broken or r.state == "failed" for r in runs)
        out[frozenset(v.tricks_on)] = SetResult(broken, tuple(evidence), stage_dir.name)
    return out


def _unfinished(stage_dir: Path) -> bool:
    return any(r.state in UNFINISHED for r in rep.load_sweep(stage_dir).runs)


def run(req: DoctorRequest, doctor_dir: Path, console, resume: bool = False) -> dict:
    """Run (or continue) the search in `doctor_dir`; returns the doctor.json content."""
    thresholds = rep.parse_thresholds([f"{k}={v}" for k, v in req.thresholds.items()])
    seeds = len(parse_seeds(req.seeds))
    doctor_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        atomic_write_text(doctor_dir / REQUEST, json.dumps(asdict(req), indent=2) + "\n")
    outcomes, stages, used, budget_hit = {}, [], 0, False
    while True:
        analysis = analyse(req.tricks, outcomes)
        stage = analysis.next
        if stage is None:
            break
        stage_dir = doctor_dir / f"{len(stages) + 1}-{stage.kind}"
        planned = {set_name(s, req.tricks) for s in stage.sets}
        if (stage_dir / MANIFEST).exists():     # resuming: the same search asks for the same sets
            found = {v.name for v in manifest_variants(read_manifest(stage_dir))}
            if found != planned:
                raise SweepError(f"{stage_dir} holds {', '.join(sorted(found))}, but the search now asks for "
                                 f"{', '.join(sorted(planned))}; start a new doctor dir")
            if _unfinished(stage_dir):
                launch.resume(stage_dir, req.launcher, req.jobs, req.hydra_args, console)
        else:
            if used + len(stage.sets) * seeds > req.max_runs:
                budget_hit = True
                break
            console.print(f"doctor stage {len(stages) + 1} ({stage.kind}): "
                          f"{', '.join(sorted(planned))}", markup=False, highlight=False)
            launch.start(stage_request(req, stage, stage_dir), console)
        found = read_stage(stage_dir, req.tricks, thresholds)
        used += len(found) * seeds
        outcomes.update(found)
        stages.append({"dir": stage_dir.name, "kind": stage.kind,
                       "sets": [{"set": set_name(s, req.tricks), "broken": found[s].broken} for s in stage.sets
                                if s in found]})
        if any(r["state"] in UNFINISHED for s in found.values() for r in s.runs):
            raise SweepError(f"{stage_dir} has runs that did not finish; continue with "
                             f"`grpo-ablate doctor --resume {doctor_dir}`")
    result = {"request": asdict(req), "runs": used, "budget_hit": budget_hit, "stages": stages,
              "necessary": sorted(analysis.necessary, key=req.tricks.index),
              "minimal_breaking_sets": [[t for t in req.tricks if t in s] for s in analysis.minimal],
              "all_on_broken": outcomes[frozenset(req.tricks)].broken if frozenset(req.tricks) in outcomes else None,
              "verdicts": verdicts(req.tricks, outcomes, analysis)}
    atomic_write_text(doctor_dir / "doctor.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(doctor_dir / "doctor.md", render_markdown(result, doctor_dir))
    return result


# ------------------------------------------------------------------------------ output
def _flags(runs: list[dict]) -> str:
    parts = []
    for r in runs:
        what = ", ".join(f"{f['name']}@{f['step']} ({f['detail']})" for f in r["flags"]) or f"healthy ({r['state']})"
        parts.append(f"`{r['run']}`: {what}")
    return "; ".join(parts)


def evidence_text(verdict: dict) -> str:
    return " · ".join(f"{e['why']}: {e['set']} {'broke' if e['broken'] else 'healthy'} — {_flags(e['runs'])}"
                      for e in verdict["evidence"]) or "—"


def summary_line(result: dict) -> str:
    if result["all_on_broken"] is False:
        return "every trick on, training stays healthy: every trick is safe"
    blamed = [v for v in result["verdicts"] if v["verdict"] not in ("safe",)]
    if any(v["verdict"] == "not to blame" for v in blamed):
        return "the base configuration breaks with no trick on: no trick is to blame"
    text = "the all-on run breaks training: " + "; ".join(f"{v['trick']} {v['verdict']}" for v in blamed
                                                          if v["verdict"] != "undetermined")
    if result["budget_hit"]:
        text += f" (search stopped at --max-runs {result['request']['max_runs']}: some tricks undetermined)"
    return text


def render_markdown(result: dict, doctor_dir: Path) -> str:
    req = result["request"]
    out = [f"# Doctor: {', '.join(req['tricks'])}", "",
           f"Base {req['base'] or 'the defaults'}; {req['steps']} steps; seeds {req['seeds']}; "
           f"{result['runs']} runs in {len(result['stages'])} stage(s) under `{doctor_dir}`; W&B group "
           f"`{req['group']}`.", "", f"**{summary_line(result)}.**", "",
           "| trick | verdict | evidence |", "|---|---|---|"]
    for v in result["verdicts"]:
        out.append(f"| {v['trick']} | {v['verdict']} | {evidence_text(v).replace('|', '/')} |")
    out += ["", "## Stages", ""]
    for i, st in enumerate(result["stages"], 1):
        sets = ", ".join(f"{s['set']} {'**broke**' if s['broken'] else 'healthy'}" for s in st["sets"])
        out.append(f"{i}. `{st['dir']}` ({st['kind']}): {sets}")
    out += ["", "## How it decides", "",
            "A set of tricks *breaks training* when any of its runs diverged, failed, or raised a breaking "
            "health flag of the report (diverged, entropy_collapse, length_blowup, repetition; kl_drift is a "
            "warning). All on first; if that broke, each trick dropped in turn (a trick whose removal heals "
            "the run is in every breaking set); then subsets, smallest first, holding those tricks, until "
            "every broken set seen contains a smallest breaking set found. A trick in no such set is *safe*. "
            "Each stage is a sweep with its own `manifest.json`; `grpo-ablate report <stage dir>` shows its "
            "runs in full.", ""]
    return "\n".join(out)


def new_doctor_dir(stamp: str) -> Path:
    path, suffix = Path("runs") / "doctor" / stamp, 1
    while path.exists():
        suffix += 1
        path = Path("runs") / "doctor" / f"{stamp}-{suffix}"
    return path


def load_request(doctor_dir: Path) -> DoctorRequest:
    path = Path(doctor_dir) / REQUEST
    if not path.exists():
        raise SweepError(f"{doctor_dir} is not a doctor dir (no {REQUEST} there)")
    try:
        return DoctorRequest(**json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError) as err:
        raise SweepError(f"{path} is not a doctor request ({err})") from None


# ------------------------------------------------------------------------------ the command
def command(given: DoctorArgs, console) -> tuple[dict, Path] | None:
    """`grpo-ablate doctor`: continue a doctor dir or start a new search; (result, doctor dir),
    or None after a dry run (printed, nothing written)."""
    if given.resume_dir is not None:
        return run(resumed_request(given), given.resume_dir, console, resume=True), given.resume_dir
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    if given.out is not None:   # not the working directory or above it, a name the file system takes
        confined_dir(given.out, "--dir")
    req = new_request(given, stamp)
    if given.dry_run:
        print_dry_run(req, console)
        return None
    doctor_dir = given.out or new_doctor_dir(stamp)
    if doctor_dir.exists() and any(doctor_dir.iterdir()):
        raise SweepError(f"{doctor_dir} already exists and is not empty; continue it with "
                         f"`grpo-ablate doctor --resume {doctor_dir}` or pick another --dir")
    return run(req, doctor_dir, console, resume=False), doctor_dir


def lint(given: DoctorArgs, console) -> int:
    """`doctor --lint FILE`: the sweep file planned as `sweep file FILE` would plan it (extra
    arguments are its runs' overrides), its pair rules printed; nothing is written. Returns the exit
    code: 1 when a rule holds that the file does not expect, else 0."""
    given_too = [name for name, value in (("--tricks", given.tricks), ("--base", given.base), ("--steps", given.steps),
                 ("--seeds", given.seeds), ("--jobs", given.jobs), ("--max-runs", given.max_runs),
                 ("--threshold", given.threshold), ("--dir", given.out), ("--dry-run", given.dry_run),
                 ("--resume", given.resume_dir)) if value]
    if given_too:
        raise SweepError(f"--lint lists a sweep file's pair rules and runs nothing; drop {', '.join(given_too)}")
    args = SweepArgs(mode="file", args=(str(given.lint), *given.args), launcher=given.launcher,
                     allow_inert=given.allow_inert)
    request = sweep_request(args)
    request.seeds = "1"   # a variant's seeds differ in nothing a rule reads (and `auto` is a fixed plan's too)
    manifest = plan(request)
    print_pair_rules(manifest, console)
    holds, expected = manifest.get("pair_rules", []), manifest.get("expected_pairs", [])
    console.print(f"{given.lint}: {len(holds) or 'no'} pair rule{'s' if len(holds) != 1 else ''} "
                  f"hold{'s' if len(holds) == 1 else ''} in its runs"
                  + (f" (expected_pairs silences {', '.join(expected)})" if expected else ""),
                  markup=False, highlight=False)
    return 1 if holds else 0


def resumed_request(given: DoctorArgs) -> DoctorRequest:
    """`doctor --resume DIR`: the request it was planned with; only --launcher, --jobs and
    hydra.* launcher settings may change."""
    args = list(given.args)
    planned = [opt for opt, value in (("--tricks", given.tricks), ("--base", given.base), ("--steps", given.steps),
               ("--seeds", given.seeds), ("--max-runs", given.max_runs), ("--dir", given.out),
               ("--threshold", given.threshold)) if value]
    train_args = [a for a in args if not a.startswith("hydra.")]
    if planned or train_args or given.dry_run:
        dropped = planned + train_args + (["--dry-run"] if given.dry_run else [])
        raise SweepError(f"--resume continues a doctor run exactly as it was planned; drop {', '.join(dropped)}"
                         " (only --launcher, --jobs and hydra.* launcher settings may change)")
    req = load_request(given.resume_dir)
    req.launcher, req.jobs = given.launcher or req.launcher, given.jobs if given.jobs is not None else req.jobs
    req.hydra_args = [a for a in args if a.startswith("hydra.")] or req.hydra_args
    return req


def new_request(given: DoctorArgs, stamp: str) -> DoctorRequest:
    """A new search's request from the command line, checked (`check`) before anything runs."""
    args = list(given.args)
    bad = [a for a in args if a.startswith("-")]
    if bad:
        raise SweepError(f"unknown option {bad[0]}; see grpo-ablate doctor --help")
    tricks = [t.strip() for t in given.tricks.split(",") if t.strip()] if given.tricks else list(DEFAULT_TRICKS)
    rep.parse_thresholds(list(given.threshold))   # bad names or values: one line, before anything runs
    req = DoctorRequest(
        tricks=tricks, base=given.base or (None if given.tricks else DEFAULT_BASE),
        steps=given.steps or DEFAULT_STEPS, seeds=given.seeds or DEFAULT_SEEDS,
        overrides=[a for a in args if not a.startswith("hydra.")],
        hydra_args=[a for a in args if a.startswith("hydra.")],
        launcher=given.launcher or "joblib", jobs=given.jobs, max_runs=given.max_runs or DEFAULT_MAX_RUNS,
        group=f"doctor-{stamp}", allow_inert=given.allow_inert,
        thresholds=dict(item.split("=", 1) for item in given.threshold))
    check(req)
    return req


def print_dry_run(req: DoctorRequest, console) -> None:
    """The first two stages' matrices, and how the search would go on."""
    T = frozenset(req.tricks)
    for stage in (Stage("all-on", [T]), Stage("leave-one-out", [T - {t} for t in req.tricks])):
        print_matrix(plan(stage_request(req, stage, None)), console)
    console.print(f"if the all-on run breaks: leave-one-out, then subsets as needed, at most "
                  f"{req.max_runs} runs in all", markup=False, highlight=False)


def print_result(result: dict, doctor_dir: Path, console) -> None:
    """Each trick's verdict and its evidence, as a table, and where the files went."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"doctor: {summary_line(result)}")
    table.add_column("trick", no_wrap=True)
    table.add_column("verdict")
    table.add_column("evidence", overflow="fold")
    for v in result["verdicts"]:
        table.add_row(v["trick"], v["verdict"], Text(evidence_text(v)))
    console.print(table)
    console.print(f"{result['runs']} runs; wrote {doctor_dir}/doctor.md and doctor.json", markup=False,
                  highlight=False)
