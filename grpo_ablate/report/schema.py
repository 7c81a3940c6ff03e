"""What the report requires of the files it reads, checked before any number is taken from them.

A manifest.json of the wrong shape is the sweep's damage: the report cannot say which runs are
the sweep's, so it refuses in one line (the run dirs can still be reported on without it). A
run's damaged file (status.json, metrics.jsonl, evals.jsonl) or a run that is not this sweep's
(another sweep id, other steps, a run dir outside the sweep dir) is one run's problem: the report
goes on without that run, with a note and one warning line naming the file.
"""
from __future__ import annotations

import math
from pathlib import Path


# what the report reads of a manifest (sweep/manifest.py writes it), by type: a key absent or null
# is read as its default (older manifests), one of another type is damage. [t]: a list of t.
MANIFEST = {"name": str, "sweep_id": str, "mode": str, "base": str, "seeds": [int], "overrides": [str],
            "variants": [dict], "contrasts": [dict], "contexts": [dict], "runs": [dict], "expected_pairs": [str]}
ENTRIES = {  # each entry of the manifest's lists
    "variants": {"name": str, "tricks_on": [str], "overrides": [str], "reference": str, "kind": str,
                 "axes": dict, "expect": [str], "context": str, "control": str},
    "contrasts": {"trick": str, "with": str, "without": str, "context": str, "tests": str},
    "contexts": {"name": str, "overrides": [str]},
    "runs": {"variant": str, "seed": int, "run_dir": str, "config_hash": str, "overrides": [str]},
}
STATUS = {"step": int, "wall_time_s": float, "config_hash": str, "reason": str,   # state: rundir.STATES
          "start": dict, "threads": int}   # the last two: none in a run dir from before they were recorded
UNIT = (0.0, 1.0)   # where an accuracy and a per-problem score lie


def _is(value, kind) -> bool:
    if isinstance(value, bool):      # JSON's true is not a seed, a step or a time
        return kind is bool
    return isinstance(value, (int, float) if kind is float else kind)


def _type_problem(data: dict, schema: dict, where: str) -> str | None:
    for key, kind in schema.items():
        value = data.get(key)
        if value is None:
            continue
        each = kind[0] if isinstance(kind, list) else None
        if each is not None and not (isinstance(value, list) and all(_is(v, each) for v in value)):
            return f"{where}`{key}` is {value!r:.40}, expected a list of {each.__name__}"
        if each is None and not _is(value, kind):
            return f"{where}`{key}` is {value!r:.40}, expected {kind.__name__}"
    return None


def manifest_problem(manifest) -> str | None:
    """What is wrong with a manifest's shape, in words; None when the report can read it."""
    if not isinstance(manifest, dict):
        return "not a JSON object"
    problem = _type_problem(manifest, MANIFEST, "")
    if problem:     # the lists below are lists only once this holds
        return problem
    for key, schema in ENTRIES.items():
        for i, entry in enumerate(manifest.get(key) or []):
            problem = problem or _type_problem(entry, schema, f"{key}[{i}]: ")
    named: dict = {}   # one run dir, two entries: one run counted twice (or as two variants)
    for i, entry in enumerate(manifest.get("runs") or [] if problem is None else []):
        if entry.get("run_dir") and named.setdefault(Path(entry["run_dir"]), i) != i:
            return f"runs[{named[Path(entry['run_dir'])]}] and runs[{i}] both name the run dir {entry['run_dir']!r}"
    return problem


def status_problem(status: dict) -> str | None:
    """What is wrong with a status.json that read_status accepted (a state and a step)."""
    return _type_problem(status, STATUS, "")


def accuracy_problem(rows: list[dict]) -> str | None:
    """An accuracy (a column named `accuracy` or `*/accuracy`) in metrics.jsonl rows that is not a
    number in [0, 1]; null and non-finite ones are the report's non-finite notes, not this."""
    for row in rows:
        for key, value in row.items():
            if key.rsplit("/", 1)[-1] != "accuracy" or value is None:
                continue
            if not _is(value, float):
                return f"`{key}` is {value!r:.40} at step {row.get('step')}, not a number"
            if math.isfinite(value) and not UNIT[0] <= value <= UNIT[1]:
                return f"`{key}` is {value:g} at step {row.get('step')}, outside [0, 1]"
    return None


def planned_steps(entry: dict, manifest: dict) -> int | None:
    """The steps the sweep gave a run: the last `steps=` of its overrides (the manifest's, then its
    variant's, when the entry has none of its own); None when none sets them."""
    variant = next((v for v in manifest.get("variants") or [] if v.get("name") == entry.get("variant")), {})
    given = entry.get("overrides") or [*(manifest.get("overrides") or []), *(variant.get("overrides") or [])]
    steps = [o.partition("=")[2] for o in given if o.lstrip("+").startswith("steps=")]
    return int(steps[-1]) if steps and steps[-1].isdigit() else None


def foreign_problem(config: dict, entry: dict, manifest: dict) -> str | None:
    """Why a run's config.yaml says it is not the run the manifest planned: another sweep's id,
    variant or seed, or other steps (`steps` is outside the config hash, so the hash check does not
    see it)."""
    sweep = config.get("sweep") if isinstance(config.get("sweep"), dict) else {}
    for what, ran, planned in (("sweep", sweep.get("id"), manifest.get("sweep_id")),
                               ("variant", sweep.get("variant"), entry.get("variant")),
                               ("seed", config.get("seed"), entry.get("seed"))):
        if ran is not None and planned is not None and str(ran) != str(planned):
            return f"its config.yaml is of {what} {ran}, not {planned} as the manifest plans"
    ran, planned = config.get("steps"), planned_steps(entry, manifest)
    if planned is not None and _is(ran, int) and ran != planned:
        return f"its config.yaml trains {ran} steps, the sweep {planned}"
    return None


def outside_problem(run_dir: str, sweep_dir: Path) -> str | None:
    """A manifest's run dir that is not inside the sweep dir (absolute, or climbing out with ..)."""
    path = Path(run_dir)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        return f"its run dir {run_dir!r} is not inside the sweep dir {sweep_dir}"
    return None
