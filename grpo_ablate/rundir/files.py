"""The run dir contract: what a run writes and how it is read back (reports and resume depend on it).

    config.yaml      resolved config                      (atomic)
    overrides.yaml   the command-line overrides            (atomic)
    metrics.jsonl    one flat JSON object per step; the source of truth for reports
    samples.jsonl    a few completions every `samples_every` steps
    evals.jsonl      each eval's per-problem scores, packed (`pack_scores`): the report's eval-noise term;
                     a sampled protocol's every sample, and its vote tallies (maj@k)
    evals/<name>.jsonl  a protocol scored after training (`grpo-ablate eval`), rows as evals.jsonl's,
                     beside evals/<name>.json, its protocol and task (atomic, written first)
    weights/step-<N>/   with eval.keep_weights: the policy at each eval step (what `eval --steps all` scores)
    status.json      running | completed | diverged | failed | interrupted, step, reason, wall time (atomic);
                     config_hash; `start` (the digest of the weights the run started from, LoRA's base
                     included, and the model asked for: rundir/starts.py) and `threads` (torch's), beside
                     the hash because they may differ by machine (a run dir from before them has neither)
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
import zipfile
from pathlib import Path

from grpo_ablate.errors import DamagedFile

STATES = ("running", "completed", "diverged", "failed", "interrupted")
TIMING_PREFIXES = ("time/", "perf/")  # the only fields that may differ between identical runs
CHECKPOINT, CHECKPOINT_TMP, CHECKPOINT_OLD = "checkpoint", "checkpoint.tmp", "checkpoint.old"
EVALS = "evals.jsonl"
EVALS_DIR = "evals"          # evals/<name>.json and .jsonl: a protocol scored after training (grpo-ablate eval)
WEIGHTS = "weights"          # eval.keep_weights: weights/step-<N>/, the policy at each eval step
EVAL_SCORES = "eval_scores"   # the key under which an eval hands its per-problem scores to the run log


def pack_scores(scores, samples: int = 1) -> dict:
    """One eval's per-problem scores, compactly: `scores` holds `samples` scores per problem,
    problem-major (P x samples values). 0/1 scores (a verifier's pass/fail) as the hex of their bits,
    50 characters for 200 problems; anything else as a list of floats. `samples` is written only
    when above 1 (a row without it has one per problem: greedy, as every row before sampled evals)."""
    scores = [float(x) for x in scores]
    if samples < 1 or len(scores) % samples:
        raise ValueError(f"{len(scores)} scores are not {samples} per problem")
    head = {"n": len(scores) // samples, **({"samples": samples} if samples > 1 else {})}
    if all(x in (0.0, 1.0) for x in scores):
        bits = "".join("1" if x else "0" for x in scores)
        padded = bits + "0" * (-len(bits) % 4)
        return {**head, "bits": "".join(f"{int(padded[i:i + 4], 2):x}" for i in range(0, len(padded), 4))}
    return {**head, "scores": [round(x, 9) for x in scores]}


def unpack_scores(row: dict) -> list[float] | None:
    """The scores of one `evals.jsonl` row, `samples` per problem, problem-major (pack_scores);
    None when the row holds none (no count, or neither `scores` nor `bits`); ValueError saying what is
    wrong when it holds them damaged (a count they do not fill, bits that are not hex)."""
    n, samples = row.get("n"), row.get("samples", 1)
    if not isinstance(n, int) or n <= 0 or not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        return None
    total = n * samples
    if "scores" in row:
        if not isinstance(row["scores"], list) or len(row["scores"]) != total:
            raise ValueError(f"`scores` is not {total} numbers ({n} problems x {samples} samples)")
        try:
            return [float(x) for x in row["scores"]]
        except ValueError:
            raise TypeError("`scores` holds a value that is not a number") from None   # as float(None) says
    bits = row.get("bits")
    if bits is None:
        return None
    if not isinstance(bits, str) or len(bits) != (total + 3) // 4:
        raise ValueError(f"`bits` is not {(total + 3) // 4} hex digits ({n} problems x {samples} samples)")
    try:
        flat = "".join(f"{int(ch, 16):04b}" for ch in bits)
    except ValueError:
        raise ValueError("`bits` is not hex") from None
    return [float(ch == "1") for ch in flat[:total]]


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


def read_json(path: Path, what: str):
    """A JSON file the tool wrote, or DamagedFile saying what is wrong with it (empty, cut short,
    not JSON, unreadable) instead of a traceback."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise DamagedFile(path, f"cannot be read ({err.strerror or err})") from None
    if not text.strip():
        raise DamagedFile(path, f"is empty (a {what} cut off mid-write)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        cut = not text.rstrip().endswith(("}", "]"))   # what the tool writes ends so: the write was cut short
        problem = "is truncated" if cut else f"is not valid JSON ({err.msg}, line {err.lineno})"
        raise DamagedFile(path, problem) from None


def read_status(run_dir: Path) -> dict | None:
    """status.json (None when there is none), or DamagedFile."""
    path = Path(run_dir) / "status.json"
    if not path.exists():
        return None
    status = read_json(path, "status")
    if not isinstance(status, dict) or status.get("state") not in STATES or not isinstance(status.get("step"), int):
        raise DamagedFile(path, "is not a run status (a state and a step)")
    return status


def read_overrides(run_dir: Path) -> list[str] | None:
    """overrides.yaml: the run's command-line overrides (None when there is none), or DamagedFile."""
    import yaml

    path = Path(run_dir) / "overrides.yaml"
    if not path.exists():
        return None
    try:
        overrides = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise DamagedFile(path, f"cannot be read as YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise DamagedFile(path, "is not a YAML list of overrides")
    return overrides


def recorded_config(run_dir: Path) -> dict:
    """The run's config.yaml as plain data; {} when it cannot be read (its resume then refuses on the config)."""
    import yaml

    try:
        config = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return config if isinstance(config, dict) else {}


def recorded_eval(run_dir: Path) -> str:
    """The eval protocol a run recorded (config.yaml's `eval.name`): `greedy` for a run from before the
    eval group, or whose config.yaml cannot be read (its resume then refuses on the config itself)."""
    config = recorded_config(run_dir)
    group = config.get("eval") if isinstance(config, dict) else None
    name = group.get("name") if isinstance(group, dict) else None
    return name if isinstance(name, str) and name else "greedy"


def checkpoint_problem(checkpoint: Path) -> str | None:
    """What is wrong with a checkpoint dir, cheaply (None: it looks whole). trainer_state.pt is a
    zip archive whose directory sits at its end, so a file cut short fails to open."""
    state = Path(checkpoint) / "trainer_state.pt"
    try:
        with zipfile.ZipFile(state) as archive:
            archive.namelist()
    except (OSError, zipfile.BadZipFile) as err:
        return f"{state.name} is damaged ({err})"
    if not any(Path(checkpoint).glob("*.safetensors")) and not any(Path(checkpoint).glob("*.bin")):
        return "holds no model weights"
    for weights in Path(checkpoint).glob("*.safetensors"):
        if not _safetensors_whole(weights):
            return f"{weights.name} is cut short"
    return None


def _safetensors_whole(path: Path) -> bool:
    """A safetensors file is an 8-byte header length, a JSON header and the tensors' bytes: it is
    whole when the header parses and the last tensor ends where the file does."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        ends = [t["data_offsets"][1] for name, t in header.items() if name != "__metadata__"]
        return path.stat().st_size == 8 + size + max(ends, default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, MemoryError):
        return False


def find_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint: checkpoint/, or checkpoint.old/ while one is swapped in."""
    for name in (CHECKPOINT, CHECKPOINT_OLD):
        path = Path(run_dir) / name
        if (path / "trainer_state.pt").exists():
            return path
    return None
