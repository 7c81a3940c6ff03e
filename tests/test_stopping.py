"""A run stopped from outside (SIGTERM: SLURM's time limit, scancel, kill) is `interrupted`,
says why, and --resume continues it; without SLURM's accounting, sweeps read job states from
squeue. The same paths on a real SLURM cluster: tests/test_slurm.py."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_ablate.rundir import stopping
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows, read_status
from grpo_ablate.rundir.stopping import how_it_ended, stop_reason
from grpo_ablate.sweep.slurm import ENDED, SqueueInfoWatcher

from conftest import cli


@pytest.fixture
def in_slurm_job(monkeypatch):
    for key, value in dict(SLURM_JOB_ID="15", SLURM_ARRAY_JOB_ID="12", SLURM_ARRAY_TASK_ID="3").items():
        monkeypatch.setenv(key, value)


def test_outside_slurm_the_reason_is_the_signal(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert stop_reason(signal.SIGTERM) == "SIGTERM"
    assert stop_reason(signal.SIGINT) == "SIGINT"
    assert how_it_ended(stopping.RunInterrupted("SIGTERM", signal.SIGTERM)) == ("interrupted", "SIGTERM")
    assert how_it_ended(RuntimeError("boom")) == ("failed", "RuntimeError: boom")


def test_slurm_says_whether_it_was_the_time_limit(in_slurm_job, monkeypatch):
    asked = []

    def scontrol(job_id, fields):
        monkeypatch.setattr(stopping, "slurm_job_fields", lambda j: asked.append(j) or fields)

    scontrol("15", {"JobState": "COMPLETING", "Reason": "TimeLimit", "TimeLimit": "00:01:00"})
    assert stop_reason(signal.SIGTERM) == "SLURM time limit (00:01:00, job 12_3)"
    assert asked == ["15"]                      # an array task is asked about by its own job id
    scontrol("15", {"JobState": "COMPLETING", "Reason": "None", "TimeLimit": "00:01:00"})
    assert stop_reason(signal.SIGTERM) == "stopped by SLURM (SIGTERM, job 12_3: scancel or preemption)"
    scontrol("15", {})                           # scontrol did not answer: submitit's USR2 warning decides
    assert stop_reason(signal.SIGTERM, warned=True) == "SLURM time limit (job 12_3)"
    assert stop_reason(signal.SIGTERM) == "stopped by SLURM (SIGTERM, job 12_3: scancel or preemption)"


def test_scontrol_fields_are_read_from_its_one_line_output(monkeypatch):
    line = ("JobId=15 ArrayJobId=12 ArrayTaskId=3 JobName=train JobState=COMPLETING Reason=TimeLimit "
            "Dependency=(null) RunTime=00:01:27 TimeLimit=00:01:00 Command=/a b/c.sh\n")
    monkeypatch.setattr(stopping.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, line, ""))
    fields = stopping.slurm_job_fields("15")
    assert (fields["Reason"], fields["TimeLimit"], fields["JobState"]) == ("TimeLimit", "00:01:00", "COMPLETING")


def test_without_accounting_job_states_come_from_squeue():
    watcher = SqueueInfoWatcher()
    for job_id in ("20_0", "20_1", "20_2", "21"):
        watcher.register_job(job_id)
    assert watcher._make_command()[0] == "squeue"
    info = watcher.read_info(b"20_1|RUNNING|vm\n20_2|PENDING|\n")   # 20_0 and 21 have left the queue
    assert {k: v["State"] for k, v in info.items()} == {"20_1": "RUNNING", "20_2": "PENDING",
                                                         "20_0": ENDED, "21": ENDED}
    watcher._info_dict.update(info)
    assert watcher.is_done("20_0", mode="cache") and not watcher.is_done("20_1", mode="cache")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])   # kill, and Ctrl-C alike
def test_a_stop_interrupts_a_run_which_resume_continues(small, tmp_path, signum):
    """kill -TERM mid-run: status `interrupted` (not `failed`), the process then ends by the
    signal as it would have; --resume continues from the checkpoint (the rows it covers stay)."""
    run_dir = tmp_path / "run"
    args = ["train", *[o for o in small if not o.startswith("steps=")], "steps=1000", "eval.every=1000",
            "checkpoint_every=2", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([sys.executable, "-m", "grpo_ablate.cli", *args], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 900
        while time.time() < deadline:
            status = read_status(run_dir) if (run_dir / "status.json").exists() else None
            if status and status["step"] >= 4:
                break
            time.sleep(0.1)
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    name = signal.Signals(signum).name
    assert proc.returncode == (130 if signum == signal.SIGINT else -signum), output   # as a shell reports Ctrl-C
    status = read_status(run_dir)
    assert (status["state"], status["reason"]) == ("interrupted", name), status
    assert f"interrupted: {name}; `grpo-ablate train --resume {run_dir}` continues it" in output, output
    assert not (run_dir / "traceback.txt").exists() and "Traceback" not in output
    before = [row for row in read_rows(run_dir / "metrics.jsonl") if row["step"] <= 4]
    end = status["step"] + 2
    r = cli("train", "--resume", str(run_dir), f"steps={end}", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    after = read_rows(run_dir / "metrics.jsonl")
    assert [row["step"] for row in after] == list(range(end + 1))
    assert after[:len(before)] == before
    assert read_status(run_dir)["state"] == "completed"


@pytest.mark.slow
def test_ctrl_c_on_a_sweep_leaves_the_running_run_interrupted_and_resume_continues_it(small, tmp_path):
    """Ctrl-C reaches the sweep and its runs (one process group, as a terminal sends it): the run is
    `interrupted`, not `failed`, and `sweep --resume` continues it from its checkpoint, not from 0."""

    sweep = tmp_path / "sweep"
    args = ["sweep", "add-one-in", "--tricks", "no_std", "--seeds", "1", "--launcher", "basic", "--no-controls",
            "--dir", str(sweep), *[o for o in small if not o.startswith("steps=")], "steps=200", "eval.every=1000",
            "checkpoint_every=2"]
    proc = subprocess.Popen([sys.executable, "-m", "grpo_ablate.cli", *args], cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 900
        while time.time() < deadline:
            status = read_status(sweep / "base-s0") if (sweep / "base-s0" / "status.json").exists() else None
            if status and status["step"] >= 4:
                break
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 130, output
    assert "Traceback" not in output and f"`grpo-ablate sweep --resume {sweep}` continues it" in output, output
    status = read_status(sweep / "base-s0")
    assert (status["state"], status["reason"]) == ("interrupted", "SIGINT"), status
    stopped_at = status["step"]
    before = [row for row in read_rows(sweep / "base-s0" / "metrics.jsonl") if row["step"] <= 4]
    r = cli("sweep", "--resume", str(sweep), cwd=tmp_path, timeout=1800)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = read_rows(sweep / "base-s0" / "metrics.jsonl")
    assert rows[:len(before)] == before and [row["step"] for row in rows] == list(range(201))
    assert stopped_at >= 4 and read_status(sweep / "base-s0")["state"] == "completed"


def session_processes(session: int) -> list[int]:
    """The live processes of a session (a sweep started in its own keeps its workers in it)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, _, sid = stat.read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue
        if int(sid) == session and state != "Z":
            found.append(int(stat.parent.name))
    return found


def metrics_of(sweep_dir: Path) -> dict:
    """Each run's metrics rows, without the timings (the only fields that may differ)."""
    return {run.name: [{k: v for k, v in row.items() if not k.startswith(TIMING_PREFIXES)}
                       for row in read_rows(run / "metrics.jsonl")]
            for run in sorted(sweep_dir.iterdir()) if (run / "metrics.jsonl").exists()}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the sweep's processes in /proc")
@pytest.mark.parametrize("launcher,signum", [("joblib", signal.SIGTERM), ("submitit_local", signal.SIGTERM),
                                             ("joblib", signal.SIGINT)], ids=["joblib-SIGTERM",
                                             "submitit_local-SIGTERM", "joblib-SIGINT"])
def test_a_stop_of_a_parallel_sweep_stops_its_workers_and_resume_equals_an_uninterrupted_sweep(
        small, tmp_path, launcher, signum):
    """kill -TERM <sweep pid> (not its group: a scheduler's or a user's stop), or Ctrl-C (to the whole group,
    as a terminal sends it): the running runs record `interrupted`, no process of the sweep is left after
    10 s, and `sweep --resume` (with fewer runs at a time: the thread share is the sweep's, not the
    resume's) gives the uninterrupted sweep's metrics."""
    overrides = [o for o in small if not o.startswith(("steps=", "threads="))] + ["checkpoint_every=2"]
    args = ["sweep", "add-one-in", "--tricks", "no_std", "--seeds", "1", "--steps", "12", "--no-controls",
            "--launcher", launcher, "--jobs", "2", *overrides]
    whole = cli(*args, "--dir", str(tmp_path / "whole"), cwd=tmp_path, timeout=1800)
    assert whole.returncode == 0, whole.stdout[-2000:] + whole.stderr[-2000:]
    sweep = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, "-m", "grpo_ablate.cli", *args, "--dir", str(sweep)], cwd=tmp_path,
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 900
        while time.time() < deadline and proc.poll() is None:
            steps = [read_status(d)["step"] for d in sweep.glob("*-s0") if (d / "status.json").exists()]
            if steps and max(steps) >= 3:   # a run has passed its first checkpoint
                break
            time.sleep(0.05)
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        stopped_at = time.time()
        output, _ = proc.communicate(timeout=60)
        time.sleep(max(0.0, stopped_at + 10 - time.time()))
        left = session_processes(proc.pid)
    finally:
        for pid in session_processes(proc.pid):   # what this test started, should the sweep have left it
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 128 + signum, output
    assert not left, f"processes of the stopped sweep still alive: {left}"
    assert "Traceback" not in output and f"`grpo-ablate sweep --resume {sweep}` continues it" in output, output
    manifest = json.loads((sweep / "manifest.json").read_text())
    stopped = [run["run_dir"] for run in manifest["runs"] if run["status"] == "interrupted"]
    assert stopped and {read_status(sweep / name)["reason"] for name in stopped} == {signum.name}, manifest["runs"]
    resumed = cli("sweep", "--resume", str(sweep), "--jobs", "1", cwd=tmp_path, timeout=1800)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    share = manifest["threads"]   # fixed by the first launch (2 runs at a time, the free cores), not by the runs left
    assert 1 <= share <= max(1, len(os.sched_getaffinity(0)) // 2) and f"1 at a time, {share} thread" in resumed.stdout
    assert metrics_of(sweep) == metrics_of(tmp_path / "whole")
    assert all(read_status(sweep / name)["state"] == "completed" for name in stopped)


@pytest.mark.slow
def test_a_stopped_sequential_sweep_leaves_its_look_undecided(small, tmp_path):
    """SIGTERM during a look's runs: the look is not decided on runs that were stopped (the next
    `--resume` finishes them and decides), and the sweep ends with 143."""
    sweep = tmp_path / "sweep"
    args = ["sweep", "add-one-in", "--tricks", "batch_norm", "--seeds", "auto", "--max-seeds", "5", "--steps", "40",
            "--launcher", "joblib", "--jobs", "2", "--no-controls", "--dir", str(sweep),
            *[o for o in small if not o.startswith("steps=")]]
    proc = subprocess.Popen([sys.executable, "-m", "grpo_ablate.cli", *args], cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 900
        while time.time() < deadline and proc.poll() is None:
            steps = [read_status(d)["step"] for d in sweep.glob("*-s*") if (d / "status.json").exists()]
            if steps and max(steps) >= 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        for pid in session_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, output
    looks = json.loads((sweep / "manifest.json").read_text())["sequential"]["looks"]
    assert len(looks) == 1 and looks[0]["decisions"] is None, looks
