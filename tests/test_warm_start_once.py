"""Two commands at once on a fresh machine: a cache entry is built by one process, the others wait for
it and say so in one line, and a builder killed midway blocks nobody (rundir/lock.py's BuildLock,
models.built_once); and `threads: null` takes the cores nobody else is using (rundir/cores.py)."""
import fcntl
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_ablate.rundir import cores
from grpo_ablate.rundir.lock import BuildLock

REPO = Path(__file__).resolve().parents[1]

# A builder as the models' built_once is, without torch (a process starts in ~0.1 s): it takes the
# entry's lock, and, where the entry is missing, builds it once `go` exists (so a test decides when
# the build ends), appending a line to `builds` for each build.
BUILDER = """
import os, sys, time, pathlib
from grpo_ablate.rundir import cores
from grpo_ablate.rundir.lock import BuildLock
entry, go, builds = (pathlib.Path(a) for a in sys.argv[1:4])
with BuildLock(entry, say=lambda text: print(text, flush=True), poll=0.05):
    if not (entry / "config.json").exists():
        print("building", flush=True)
        while not go.exists():
            time.sleep(0.02)
        with open(builds, "a") as f:
            f.write(f"{os.getpid()}\\n")
        tmp = entry.parent / f".{entry.name}-tmp{os.getpid()}"
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
        os.rename(tmp, entry)
print("ready", flush=True)
"""


def start_builder(entry: Path, go: Path, builds: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", BUILDER, str(entry), str(go), str(builds)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_until(proc: subprocess.Popen, needle: str) -> list[str]:
    """The lines `proc` printed, up to the first that holds `needle`."""
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if needle in line:
            return lines
    raise AssertionError(f"process {proc.pid} ended without printing {needle!r}: {lines}")


def test_two_processes_build_a_cold_entry_once_and_the_waiter_says_whom_it_waits_for(tmp_path):
    entry, go, builds = tmp_path / "cache" / "tiny-abc", tmp_path / "go", tmp_path / "builds"
    entry.parent.mkdir()
    first = start_builder(entry, go, builds)
    read_until(first, "building")                # it holds the lock, and waits for `go`
    second = start_builder(entry, go, builds)
    said = read_until(second, "waiting for")
    go.touch()
    out_first, out_second = first.communicate(timeout=30)[0], second.communicate(timeout=30)[0]
    assert first.returncode == second.returncode == 0, (out_first, out_second)
    assert builds.read_text().split() == [str(first.pid)]     # built once, by the first
    assert said == [f"waiting for process {first.pid} on {os.uname().nodename}, which is building tiny-abc in "
                    f"{entry.parent} (built once, then shared)"]
    assert "building" not in out_second and out_second.split() == ["ready"]   # one line while it waited
    assert sorted(p.name for p in entry.parent.iterdir()) == ["tiny-abc"]      # no lock file, no temporary


def test_a_builder_killed_midway_blocks_nobody(tmp_path):
    entry, go, builds = tmp_path / "tiny-abc", tmp_path / "go", tmp_path / "builds"
    first = start_builder(entry, go, builds)
    read_until(first, "building")
    second = start_builder(entry, go, builds)
    read_until(second, "waiting for")
    first.send_signal(signal.SIGKILL)           # its lock file stays, naming it; the OS lock goes with it
    first.wait()
    taken = read_until(second, "building")
    assert taken == [f"{tmp_path / '.tiny-abc.lock'}: its process {first.pid} is gone; taking the cache entry over",
                     "building"]
    go.touch()
    assert second.communicate(timeout=30)[0].split() == ["ready"] and second.returncode == 0
    assert builds.read_text().split() == [str(second.pid)] and (entry / "config.json").exists()


def test_a_lock_still_held_for_a_builder_that_is_gone_is_broken(tmp_path):
    """A descriptor inherited by a child keeps the OS lock after its builder died: the file names a
    process of this host that is gone, and the waiter breaks the lock instead of waiting forever."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = tmp_path / ".tiny-abc.lock"
    lock.write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename}))
    inherited = os.open(lock, os.O_RDWR)
    fcntl.flock(inherited, fcntl.LOCK_EX)
    said = []
    try:
        with BuildLock(tmp_path / "tiny-abc", say=said.append, poll=0.01):
            assert json.loads(lock.read_text())["pid"] == os.getpid()
    finally:
        os.close(inherited)
    assert said == [f"{lock}: its process {dead.pid} is gone; breaking its lock"]
    assert not lock.exists()


def test_an_entry_built_meanwhile_is_not_built_again(tmp_path, monkeypatch):
    """models.built_once checks again under the lock: what the process it waited for built is used."""
    from grpo_ablate import models

    entry = tmp_path / "tiny-abc"
    built = []

    def build_by_another():
        built.append("ours")

    monkeypatch.setattr(models, "BuildLock", lambda target, say: _BuiltWhileWaiting(target))
    assert models.built_once(entry, build_by_another, log=lambda *a: None) == entry
    assert built == [] and (entry / "config.json").exists()


class _BuiltWhileWaiting:
    """A lock whose wait ends with the entry built by the process it waited for."""

    def __init__(self, target: Path):
        self.target = target

    def __enter__(self):
        self.target.mkdir()
        (self.target / "config.json").write_text("{}")

    def __exit__(self, *exc):
        return None


# ------------------------------------------------------------------------------ threads: null
@pytest.mark.parametrize("mine, machine, others, free", [
    (2, 2, 0.0, 2),     # an idle machine: every core
    (2, 2, 0.4, 2),     # a little busy: still nearest to 2
    (2, 2, 1.6, 1),     # one core's worth busy: the other
    (2, 2, 9.0, 1),     # busier than it has cores: one thread, never none
    (16, 16, 5.4, 11),
    (4, 16, 30.0, 4),   # held to 4 of 16 cores (SLURM, taskset, a cpuset): they are its own
])
def test_threads_null_takes_the_cores_nobody_else_is_using(monkeypatch, mine, machine, others, free):
    monkeypatch.setattr(cores, "cores", lambda: mine)
    monkeypatch.setattr(cores.os, "cpu_count", lambda: machine)
    monkeypatch.setattr(cores, "others_running", lambda: others)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cores.free_cores() == free and cores.cpu_threads(None) == free
    assert cores.cpu_threads(3) == 3                           # threads= given: as given
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert cores.cpu_threads(None) == 5                        # the user's own limit


def test_others_running_reads_the_load_and_who_runs_now():
    assert cores.others_running() >= 0.0


def test_a_resumed_run_takes_the_threads_it_recorded(tmp_path):
    from grpo_ablate.config.resume_rules import threads_to_run

    status = {"state": "interrupted", "step": 2, "threads": 2}
    assert threads_to_run(None, status, tmp_path / "checkpoint") == 2       # continued: as it started
    assert threads_to_run(1, status, tmp_path / "checkpoint") == 1          # threads= given: as given
    assert threads_to_run(None, status, None) is None                       # started over: the cores free now
    assert threads_to_run(None, {"state": "interrupted", "step": 2}, tmp_path) is None   # from before the record


# ------------------------------------------------------------------------------ the real warm start
# ensure_warm_started in a process of its own; its warm-up first waits for `go` and counts itself in `builds`
REAL_BUILDER = """
import sys, time, pathlib
from grpo_ablate import models
from grpo_ablate.config.compose import compose
from grpo_ablate.tasks import build_task
go, builds = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
warm_start = models.warm_start

def held(*args, **kwargs):
    with open(builds, "a") as f:
        f.write("built\\n")
    while not go.exists():
        time.sleep(0.05)
    return warm_start(*args, **kwargs)

models.warm_start = held
cfg = compose(sys.argv[3:])
path = models.ensure_warm_started(cfg.model, build_task(cfg.task), log=lambda text: print(text, flush=True))
print("path", path, flush=True)
"""


@pytest.mark.full
def test_two_real_cold_warm_starts_of_one_entry_build_it_once(tmp_path):
    from conftest import SMALL

    cache, go, builds = tmp_path / "cache", tmp_path / "go", tmp_path / "builds"
    overrides = [o for o in SMALL if not o.startswith("model.warmup.steps=")] + [
        "model.warmup.steps=20", f"model.cache_dir={cache}"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    start = lambda: subprocess.Popen([sys.executable, "-c", REAL_BUILDER, str(go), str(builds), *overrides],  # noqa: E731
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = start()
    read_until(first, "warm-starting the embedded tiny model")
    second = start()
    waiting = read_until(second, "waiting for")
    go.touch()
    out_first, out_second = first.communicate(timeout=120)[0], second.communicate(timeout=120)[0]
    assert first.returncode == second.returncode == 0, (out_first, out_second)
    assert builds.read_text().split() == ["built"]                           # one warm-up, not two
    assert waiting[-1].startswith(f"waiting for process {first.pid} on ") and "(built once, then shared)" in waiting[-1]
    assert "warm-starting" not in out_second and "warm-up step" not in out_second
    paths = {line.split(" ", 1)[1] for line in (out_first + out_second).splitlines() if line.startswith("path ")}
    assert len(paths) == 1 and (Path(paths.pop()) / "warm_start.json").exists()
    assert [p.name.startswith("tiny-") for p in cache.iterdir()] == [True]   # no lock, no temporary left
