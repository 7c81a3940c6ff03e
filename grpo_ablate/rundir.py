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
    status.json      running | completed | diverged | failed | interrupted, step, reason, wall time (atomic)
    checkpoint/      latest weights + optimizer + RNG state, replaced atomically
    traceback.txt    the whole story of a crash (status.json has its one-line reason)

Every write that a resume depends on goes to a temporary file first and is renamed into
place. This module is torch-free: the report reads run dirs on machines without torch;
the writers that need torch (checkpoints, W&B) are in `grpo_ablate/train/run_log.py`.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import socket
import tempfile
import time
import zipfile
from pathlib import Path

from grpo_ablate.errors import ConfigError, DamagedFile

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
    None when the row is not one."""
    n, samples = row.get("n"), row.get("samples", 1)
    if not isinstance(n, int) or n <= 0 or not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        return None
    total = n * samples
    if isinstance(row.get("scores"), list) and len(row["scores"]) == total:
        return [float(x) for x in row["scores"]]
    bits = row.get("bits")
    if not isinstance(bits, str) or len(bits) != (total + 3) // 4:
        return None
    try:
        flat = "".join(f"{int(ch, 16):04b}" for ch in bits)
    except ValueError:
        return None
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


def recorded_eval(run_dir: Path) -> str:
    """The eval protocol a run recorded (config.yaml's `eval.name`): `greedy` for a run from before the
    eval group, or whose config.yaml cannot be read (its resume then refuses on the config itself)."""
    import yaml

    try:
        config = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return "greedy"
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


# ------------------------------------------------------------------------------ one writer a dir
LOCK = ".lock"
_HELD: dict[str, list] = {}   # lock path -> [open fd, how often this process holds it] (the CLI, then its trainer)


class DirLock:
    """A run dir or sweep dir is written by one process at a time. The writer holds an OS lock
    (flock) on `.lock` while it works, and writes its pid and host there for the messages; the
    file is removed when it ends. The OS drops the lock when its process ends however it ends,
    so a lock nobody holds is stale whatever the file says (garbage, a recycled pid, pid 1),
    and taking one over cannot race: whoever gets the OS lock on the file at the path owns it.
    A held lock, or a file naming a process on another host (a shared file system), is refused
    in one line. Re-entrant within a process."""

    def __init__(self, directory: Path, what: str, say=None):
        self.directory, self.what, self.say = Path(directory), what, say or (lambda text: None)
        self.path = self.directory / LOCK
        self.me = {"pid": os.getpid(), "host": socket.gethostname()}

    def acquire(self) -> "DirLock":
        key = str(self.path.resolve())
        if key in _HELD:
            _HELD[key][1] += 1
            return self
        for _ in range(5):
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise ConfigError(self._held_message()) from None
            except OSError as err:   # a file system without locks (some NFS mounts): the work goes on, unguarded
                self.say(f"{self.path}: this file system cannot lock files ({err.strerror}); nothing stops a "
                         f"second process from writing this {self.what}")
            if not self._still_at_path(fd):   # its holder removed it between our open and our lock
                os.close(fd)
                continue
            left = os.read(fd, 4096).decode(errors="replace").strip()
            self._refuse_other_host(fd, left)
            if left:
                self.say(f"{self.path}: {self._left_by(left)}; taking the {self.what} over")
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps({**self.me, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n").encode(), 0)
            _HELD[key] = [fd, 1]
            return self
        raise ConfigError(f"could not lock {self.what} {self.directory}: {self.path} keeps changing hands")

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except IsADirectoryError:
            raise ConfigError(f"{self.path} is a directory, not {self.what}'s lock file; remove it "
                              f"(rmdir {self.path}) and run again") from None
        except OSError as err:
            raise ConfigError(f"cannot lock {self.what} {self.directory}: {self.path}: {err.strerror}") from None

    def _still_at_path(self, fd: int) -> bool:
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def _held_message(self) -> str:
        holder = _read_holder(self.path)
        who = f"process {holder[0]}" if holder else "another process"
        return f"{self.what} {self.directory} is in use by {who} on this machine ({self.path}); wait for it to " \
               "finish or stop it"

    def _refuse_other_host(self, fd: int, left: str) -> None:
        holder = _parse_holder(left)
        if holder and holder[1] != self.me["host"]:
            os.close(fd)   # its OS lock may not reach us across machines: that process may still be running
            raise ConfigError(f"{self.what} {self.directory} is in use by process {holder[0]} on {holder[1]} "
                              f"({self.path}); wait for it, or delete that file if that process is gone")

    @staticmethod
    def _left_by(left: str) -> str:
        """Who left a lock nobody holds. Its pid may be alive (pid 1 in a container, a recycled
        pid): that process does not hold the lock, so it is not called gone."""
        holder = _parse_holder(left)
        if not holder:
            return "the process that left it is gone"
        if holder[0] <= 0:   # no process has such a pid (and kill(-1) would ask about every process)
            return f"its process {holder[0]} is gone"
        try:
            os.kill(holder[0], 0)
        except ProcessLookupError:
            return f"its process {holder[0]} is gone"
        except OSError:   # alive, another user's (PermissionError), or a pid the OS refuses
            pass
        return f"its process {holder[0]} no longer holds it (that pid is alive, but does not hold the lock)"

    def release(self) -> None:
        key = str(self.path.resolve())
        if key not in _HELD:
            return
        _HELD[key][1] -= 1
        if _HELD[key][1] == 0:
            fd, _ = _HELD.pop(key)
            self.path.unlink(missing_ok=True)   # while still holding it: a waiting opener finds it gone, retries
            os.close(fd)

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _parse_holder(text: str) -> tuple[int, str] | None:
    """(pid, host) from a lock file's text, or None when it names none."""
    try:
        holder = json.loads(text)
        return int(holder["pid"]), str(holder["host"])
    except (ValueError, KeyError, TypeError):
        return None


def _read_holder(path: Path) -> tuple[int, str] | None:
    try:
        return _parse_holder(path.read_text())
    except OSError:
        return None


def release_all_locks() -> None:
    """Remove every lock this process holds: it is about to end by a signal, past any `finally`."""
    for key in list(_HELD):
        fd, _ = _HELD.pop(key)
        Path(key).unlink(missing_ok=True)
        os.close(fd)


# ------------------------------------------------------------------------------ where a command writes
NAME_MAX = 255   # bytes in one path component on the usual file systems (ext4, xfs, btrfs, apfs)


def confined_dir(path, what: str, root: Path | None = None) -> Path:
    """`path` as a dir a command may create and write, or ConfigError in one line. Resolved first
    (`..`, symlinks, `~`), then refused when it is empty, has a name longer than a file system
    allows, or, inside `root` (a sweep's runs in its sweep dir), is not strictly under it; without
    a root, when it is the working directory or one above it: a run or sweep dir there would mix
    the tool's files (and a later rerun's set-aside) with the user's own."""
    text = "" if path is None else str(path)
    if not text.strip():
        raise ConfigError(f"{what} is empty; give the path of a new directory")
    resolved = Path(os.path.abspath(os.path.expanduser(text))).resolve()
    too_long = [part for part in Path(text).parts + resolved.parts if len(os.fsencode(part)) > NAME_MAX]
    if too_long:
        raise ConfigError(f"{what} {_shortened(text)}: the name {_shortened(too_long[0])} is "
                          f"{len(os.fsencode(too_long[0]))} bytes, longer than the {NAME_MAX} a file system allows; "
                          "give a shorter one")
    if root is not None:
        inside = Path(os.path.abspath(os.path.expanduser(str(root)))).resolve()
        if inside not in resolved.parents:
            raise ConfigError(f"{what} {text} is outside {root}; it must be a directory inside it")
        return Path(text)
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        where = "the working directory" if resolved == cwd else f"above the working directory {cwd}"
        raise ConfigError(f"{what} {text} is {where}; give a new directory inside it (e.g. runs/my-run) "
                          "or elsewhere")
    return Path(text)


def hydra_quoted(path) -> str:
    """A path as a Hydra override value: absolute and quoted, so that any character is allowed
    (Hydra's grammar takes only ASCII unquoted: `hydra.run.dir=rün` is a lexer error)."""
    return "'" + str(Path(path).resolve()).replace("\\", "\\\\").replace("'", "\\'") + "'"


def hydra_unquoted(value: str) -> str:
    """An override's value as the path it names: Hydra's quotes (`'a b'`, `"a b"`) taken off."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1].replace("\\" + value[0], value[0])
    return value


def _shortened(text: str, keep: int = 40) -> str:
    """A name as a message quotes it: a 300-character one would be the whole line."""
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"


def writable_problem(path: Path) -> str | None:
    """Why a directory cannot be made or written at `path` (None: it can): the first part of the
    path that exists is a file, or is not writable (a read-only file system, permissions)."""
    probe = Path(os.path.abspath(os.path.expanduser(str(path))))
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file, not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


def cache_message(cache_root: Path, problem: str) -> str:
    """The embedded model's cache cannot be written: where, why, and the setting that moves it."""
    return (f"cannot write the model cache {cache_root}: {problem}; set GRPO_ABLATE_CACHE (or model.cache_dir) to a "
            "writable directory")
