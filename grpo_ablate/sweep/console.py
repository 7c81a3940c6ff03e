"""What a sweep prints and what it expects to cost: the dry-run listing, the summary, timing.

The dry run's matrix table, the plan's pair-rule warnings and its runs per context, the summary
of a sweep (variant x seed -> final eval accuracy or status, and how to continue an interrupted
run), and the expected wall time, from the runs of the newest finished sweep beside this one
on the cores (`cpus`) local runs share.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from grpo_ablate.design import manifest_variants
from grpo_ablate.rundir.cores import cores
from grpo_ablate.rundir.files import read_status
from grpo_ablate.rundir.stopping import INTERRUPTED
from grpo_ablate.sweep.plan import SweepRequest


def print_matrix(manifest: dict, console) -> None:
    """--dry-run: every variant, its tricks and its overrides, as a table; nothing is written."""
    from rich.table import Table
    from rich.text import Text

    seeds = manifest["seeds"]
    table = Table(title=f"sweep {manifest['name']} ({manifest['mode']}): {len(manifest['variants'])} variants x "
                        f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''} ({', '.join(map(str, seeds))}) = "
                        f"{len(manifest['runs'])} runs; nothing written")
    table.add_column("variant", no_wrap=True)   # names stay whole and copy-pasteable
    table.add_column("tricks on", overflow="fold")
    table.add_column("overrides", overflow="fold")
    common = " ".join(manifest["overrides"])
    for v in manifest_variants(manifest):
        table.add_row(v.name, ", ".join(v.tricks_on) or "-",   # Text: "[a,b]" is not markup
                      Text(" ".join(filter(None, [common, *v.overrides])) or "(the defaults)"))
    console.print(table)
    print_pair_rules(manifest, console)


def print_pair_rules(manifest: dict, console) -> None:
    """The plan's pair rules (config/pair_rules.py): one warning line each, naming its variants."""
    for line in manifest.get("pair_rules", []):
        console.print(f"warning: {line}", markup=False, highlight=False)


def contexts_text(manifest: dict, req: SweepRequest, wall: bool = True) -> str:
    """--dry-run across contexts: the runs in each context, and (`wall`) what the grid costs."""
    lines = []
    for c in manifest["contexts"]:
        variants = [v for v in manifest_variants(manifest) if v.context == c["name"]]
        runs = [r for r in manifest["runs"] if r["variant"] in {v.name for v in variants}]
        lines.append(f"  {c['name']}: {len(variants)} variants, {len(runs)} runs "
                     f"({' '.join(c['overrides']) or 'no overrides'})")
    contrasts = len(manifest["contrasts"])
    head = (f"across {len(manifest['contexts'])} contexts: {len(manifest['runs'])} runs, "
            f"{contrasts} contrasts (each trick in each context)")
    return "\n".join([head, *lines, *([expected_wall(len(manifest["runs"]), req)] if wall else [])])


def print_summary(manifest: dict, console, sweep_dir: Path) -> None:
    """Variant x seed -> status and final eval accuracy."""
    from rich.table import Table

    seeds = manifest["seeds"]
    by_key = {(r["variant"], r["seed"]): r for r in manifest["runs"]}
    table = Table(title=f"sweep {manifest['name']}: final eval accuracy by variant and seed")
    table.add_column("variant", no_wrap=True)
    for s in seeds:
        table.add_column(f"seed {s}", justify="right")
    for v in manifest_variants(manifest):
        cells = []
        for s in seeds:
            run = by_key.get((v.name, s))
            if run is None:
                cells.append("-")
            elif run["status"] == "completed" and run["final_accuracy"] is not None:
                cells.append(f"{run['final_accuracy']:.3f}")
            elif run["status"] == "diverged":
                cells.append(f"diverged@{run['step']}")
            else:
                cells.append(run["status"] + (f"@{run['step']}" if run["step"] else ""))
        table.add_row(v.name, *cells)
    console.print(table)
    counts = {}
    for run in manifest["runs"]:
        counts[run["status"]] = counts.get(run["status"], 0) + 1
    console.print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f"  ({sweep_dir})",
                  markup=False, highlight=False)
    for run in manifest["runs"]:
        if run["status"] == "failed":
            console.print(f"  {run['run_dir']} failed: {run['reason']}", markup=False, highlight=False)
        elif run["status"] == INTERRUPTED:   # stopped from outside (a time limit): --resume continues it
            console.print(f"  {run['run_dir']} interrupted at step {run['step']}: {run['reason']}; "
                          f"`grpo-ablate sweep --resume {sweep_dir}` continues it", markup=False, highlight=False)


def measured_run_seconds(parent: Path) -> tuple[float, str] | None:
    """The median wall time of the completed runs of the newest sweep in `parent`, and which."""
    manifests = sorted(Path(parent).glob("*/manifest.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in manifests:
        seconds = [s["wall_time_s"] for s in (read_status(d) for d in path.parent.iterdir() if d.is_dir()
                                              and (d / "status.json").exists())
                   if s and s.get("state") == "completed" and s.get("wall_time_s")]
        if seconds:
            return statistics.median(seconds), f"the median of {len(seconds)} runs of {path.parent}"
    return None


def run_timing(req: SweepRequest) -> tuple[float, str, int] | None:
    """(seconds a run, where that figure comes from, runs at a time), or None when no finished
    sweep beside this one has timed a run."""
    parent = Path(req.sweep_dir).parent if req.sweep_dir else Path("runs") / "sweeps"
    measured = measured_run_seconds(parent) if parent.is_dir() else None
    if measured is None:
        return None
    parallel = 1 if req.launcher == "basic" else max(1, req.jobs or cpus())
    return (*measured, parallel)


def expected_wall(runs: int, req: SweepRequest) -> str:
    """What `runs` runs cost in wall time, from the runs of the newest finished sweep beside this one."""
    measured = run_timing(req)
    if measured is None:
        parent = Path(req.sweep_dir).parent if req.sweep_dir else Path("runs") / "sweeps"
        return f"expected wall time: unknown (no finished sweep in {parent} to time a run from)"
    per_run, source, parallel = measured
    return (f"expected wall time of {runs} runs: ~{duration(math.ceil(runs / parallel) * per_run)} "
            f"({per_run:.0f} s a run, {source}; {parallel} at a time)")


def duration(seconds: float) -> str:
    """Seconds as a person reads them: 40 s, 25 min, 2.5 h."""
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def cpus() -> int:
    """The cores this process may use (local launchers split them among parallel runs)."""
    return cores()
