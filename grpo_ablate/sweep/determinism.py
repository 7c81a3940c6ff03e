"""`grpo-ablate sweep aa --determinism`: is a run bit-for-bit repeatable on this machine?

The A/A sweep's reference at its first seed is trained twice from scratch, each as an ordinary
`grpo-ablate train` run in its own dir under the sweep dir (`first/`, `second/`), and their
metrics.jsonl compared row by row, every logged value but the timings (rundir.TIMING_PREFIXES).
The first metric and step that differ are named. An A/A sweep measures the noise between arms
that differ by their sampling stream; this measures whether the same stream gives the same run.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows
from grpo_ablate.rundir.paths import hydra_quoted
from grpo_ablate.sweep.manifest import check_new_dir, planned_sweep_dir
from grpo_ablate.sweep.matrix import SweepError
from grpo_ablate.sweep.plan import SweepRequest, plan

RUNS = ("first", "second")   # the two runs' dirs, under the sweep dir


def first_difference(first: list[dict], second: list[dict]) -> str | None:
    """Where two runs' metrics.jsonl rows first differ (timings aside), in words; None when they are
    identical. Values compare as JSON writes them: a float's every bit, NaN equal to NaN."""
    for i, (a, b) in enumerate(zip(first, second)):
        step = a.get("step", i)
        for key in sorted((set(a) | set(b)) - {"step"}):
            if key.startswith(TIMING_PREFIXES):
                continue
            if key not in a or key not in b:
                return f"`{key}` at step {step}: logged by the {'first' if key in a else 'second'} run only"
            if json.dumps(a[key]) != json.dumps(b[key]):
                return f"`{key}` first differs at step {step}: {a[key]!r} vs {b[key]!r}"
        if a.get("step") != b.get("step"):
            return f"row {i} is step {a.get('step')} in the first run and step {b.get('step')} in the second"
    if len(first) != len(second):
        return f"the first run logged {len(first)} rows and the second {len(second)}"
    return None


def compare_runs(first_dir: Path, second_dir: Path) -> str | None:
    """first_difference of two run dirs' metrics.jsonl."""
    return first_difference(read_rows(first_dir / "metrics.jsonl"), read_rows(second_dir / "metrics.jsonl"))


def check(req: SweepRequest, console, dry_run: bool = False) -> int:
    """Plan the A/A sweep, train its reference's first run twice, compare. Exit 0: identical; 1: not
    (or a run did not complete)."""
    if req.sweep_dir is not None and not dry_run:
        check_new_dir(Path(req.sweep_dir))
    manifest = plan(req)
    # the reference: the first treatment measured against nothing (in the first context, with --across)
    reference = next(v["name"] for v in manifest["variants"] if v.get("kind") != "control" and not v.get("reference"))
    run = next(r for r in manifest["runs"] if r["variant"] == reference)
    sweep_dir = planned_sweep_dir(req, manifest)
    say = lambda text: console.print(text, markup=False, highlight=False)
    say(f"determinism: {run['run_dir']} trained twice -> {sweep_dir}/{{{','.join(RUNS)}}}")
    if dry_run:
        return 0
    for name in RUNS:
        run_dir = sweep_dir / name
        done = subprocess.run([sys.executable, "-m", "grpo_ablate.cli", "train", *run["overrides"],
                               f"hydra.run.dir={hydra_quoted(run_dir)}"], capture_output=True, text=True)
        if done.returncode != 0:
            raise SweepError(f"determinism: the {name} run of {run['run_dir']} exited {done.returncode}: "
                             f"{(done.stderr.strip().splitlines() or ['(no message)'])[-1]} (see {run_dir})")
    difference = compare_runs(*(sweep_dir / name for name in RUNS))
    if difference is None:
        rows = len(read_rows(sweep_dir / RUNS[0] / "metrics.jsonl"))
        say(f"determinism check passed: {rows} rows of metrics.jsonl bit-identical (timings aside)")
        return 0
    say(f"determinism check failed: {difference}")
    return 1
