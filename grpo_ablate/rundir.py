"""The run dir contract: what a run writes and how it is read back (reports and resume depend on it).

    config.yaml      resolved config                      (atomic)
    overrides.yaml   the command-line overrides            (atomic)
    metrics.jsonl    one flat JSON object per step; the source of truth for reports
    samples.jsonl    a few completions every `samples_every` steps
    status.json      running | completed | diverged | failed | interrupted, step, reason, wall time (atomic)
    checkpoint/      latest weights + optimizer + RNG state, replaced atomically
    traceback.txt    the whole story of a crash (status.json has its one-line reason)

Every write that a resume depends on goes to a temporary file first and is renamed into
place. This module is torch-free: the report reads run dirs on machines without torch;
the writers that need torch (checkpoints, W&B) are in `grpo_ablate/train/run_log.py`.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

TIMING_PREFIXES = ("time/", "perf/")  # the only fields that may differ between identical runs
CHECKPOINT, CHECKPOINT_TMP, CHECKPOINT_OLD = "checkpoint", "checkpoint.tmp", "checkpoint.old"


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def finite_or_none(value):
    """Strict JSON: NaN/Inf are written as null (the step that produced them is flagged)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_jsonl(path: Path) -> tuple[list[dict], list[str]]:
    """Rows of a JSONL file and what was wrong with it. A torn last line (a kill mid-write)
    is skipped; so is any other unparsable line, but that one is reported. A missing file
    has no rows."""
    rows, problems = [], []
    if not Path(path).exists():
        return rows, problems
    lines = Path(path).read_text(errors="replace").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            problems.append("torn last line ignored" if number == len(lines)
                            else f"unparsable line {number} skipped")
            continue
        rows.append(row)
    return rows, problems


def read_rows(path: Path) -> list[dict]:
    """The rows of a JSONL file, bad lines skipped (see read_jsonl)."""
    return read_jsonl(path)[0]


def truncate_jsonl(path: Path, last_step: int) -> None:
    """Keep rows with step <= last_step (what the checkpoint covers), atomically."""
    rows = [r for r in read_rows(path) if r.get("step", 0) <= last_step]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def read_status(run_dir: Path) -> dict | None:
    path = Path(run_dir) / "status.json"
    return json.loads(path.read_text()) if path.exists() else None


def find_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint: checkpoint/, or checkpoint.old/ while one is swapped in."""
    for name in (CHECKPOINT, CHECKPOINT_OLD):
        path = Path(run_dir) / name
        if (path / "trainer_state.pt").exists():
            return path
    return None
