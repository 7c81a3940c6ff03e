"""SLURM for real: a one-node cluster on this machine (scripts/slurm.sh, brought up by the
`slurm_cluster` fixture), sweeps through Hydra's submitit_slurm launcher, a job cancelled
mid-run and resumed, a job killed at its time limit, and one data-parallel run over the two
tasks of a job step. Where the cluster cannot run (not root, no apt-get), they skip with the
reason. Each sweep job is a fresh Python process on a 2-core machine, so they take minutes."""
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli
from grpo_ablate.config.compose import compose
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows, read_status
from grpo_ablate.train.grpo import train

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

SLURM = ["--launcher", "submitit_slurm", "hydra.launcher.partition=debug"]
NOISE = ("sacct", "accounting storage is disabled", "Bypassing")   # what submitit printed without accounting


def override(base, *extra):
    keys = {e.split("=", 1)[0] for e in extra}
    return [o for o in base if o.split("=", 1)[0] not in keys] + list(extra)


def manifest(sweep_dir: Path) -> dict:
    return json.loads((sweep_dir / "manifest.json").read_text())


def run_files(run_dir: Path) -> dict:
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def slurm_job_of(pid: int) -> str:
    """The SLURM job a process runs in (its SLURM_JOB_ID)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"SLURM_JOB_ID="))


def wait_for(condition, what: str, timeout: float = 900):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_a_sweep_through_slurm_completes_and_is_reported(slurm_cluster, small, tmp_path):
    sweep_dir = tmp_path / "sweep"
    r = cli("sweep", "add-one-in", "--tricks", "batch_norm", "--seeds", "2", "--no-controls",
            "--dir", str(sweep_dir), *SLURM, *small, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    m = manifest(sweep_dir)
    assert m["launcher"] == "submitit_slurm"
    assert [(x["variant"], x["seed"], x["status"], x["step"]) for x in m["runs"]] == [
        (v, s, "completed", 4) for s in (0, 1) for v in ("base", "add-batch_norm")]
    # four SLURM jobs (one array) each left submitit's result next to their logs
    assert len(list(sweep_dir.glob(".submitit/*_*/*_result.pkl"))) == 4
    assert "4 completed" in r.stdout
    assert not [n for n in NOISE if n in r.stdout + r.stderr], r.stdout + r.stderr   # a quiet console
    r = cli("report", str(sweep_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    report = (sweep_dir / "report.md").read_text()
    assert "4 runs: 4 completed" in report and "**batch_norm**" in report


def test_a_cancelled_job_resumes_from_its_checkpoint(slurm_cluster, small, tmp_path):
    """scancel mid-run: the run records `interrupted`; --resume continues it from its
    checkpoint, leaves the finished run untouched, and the manifest lists each run once."""
    sweep_dir = tmp_path / "sweep"
    args = ["sweep", "add-one-in", "--tricks", "batch_norm", "--seeds", "1", "--no-controls", "--jobs", "1",
            "--dir", str(sweep_dir), *SLURM,
            *override(small, "steps=40", "checkpoint_every=2", "eval.every=20", "samples_every=20")]
    sweep = subprocess.Popen([sys.executable, "-m", "grpo_ablate.cli", *args], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # one job at a time: the first run finishes, then the second is cancelled past its step-4 checkpoint
        victim = sweep_dir / "add-batch_norm-s0"

        def running_past_a_checkpoint():
            status = read_status(victim) if (victim / "status.json").exists() else None
            return status if status and status["state"] == "running" and status["step"] >= 4 else None

        status = wait_for(running_past_a_checkpoint, "the second run to pass its step-4 checkpoint")
        subprocess.run(["scancel", slurm_job_of(status["pid"])], check=True)
        output, _ = sweep.communicate(timeout=900)
    finally:
        sweep.kill()
    assert sweep.returncode == 1, output
    status = read_status(victim)
    assert status["state"] == "interrupted" and "stopped by SLURM (SIGTERM" in status["reason"], status
    assert "scancel" in status["reason"] and not (victim / "traceback.txt").exists()
    assert f"add-batch_norm-s0 interrupted at step {status['step']}" in output
    assert [x["status"] for x in manifest(sweep_dir)["runs"]] == ["completed", "interrupted"]
    finished = run_files(sweep_dir / "base-s0")
    before = read_rows(victim / "metrics.jsonl")

    r = cli("sweep", "--resume", str(sweep_dir), cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 of 2 runs finished, 1 to run" in r.stdout
    assert run_files(sweep_dir / "base-s0") == finished
    assert not (sweep_dir / ".failed").exists()                  # continued, not started over
    after = read_rows(victim / "metrics.jsonl")
    assert [row["step"] for row in after] == list(range(41))
    kept = [row for row in before if row["step"] <= 4]
    assert after[:len(kept)] == kept            # the rows up to its checkpoint, timings and all
    m = manifest(sweep_dir)
    assert sorted(x["run_dir"] for x in m["runs"]) == ["add-batch_norm-s0", "base-s0"]
    assert all(x["status"] == "completed" and x["step"] == 40 for x in m["runs"])


def test_a_job_killed_at_its_time_limit_is_interrupted_not_failed(slurm_cluster, small, tmp_path):
    """SLURM's time limit (1 minute, the shortest it has) sends SIGTERM: the run says so in
    status.json, the sweep's summary and the report, and --resume would continue it."""
    sweep_dir = tmp_path / "sweep"
    # signal_delay_s=0: no early warning (USR2), which SLURM would send up to a minute early,
    # i.e. before this one-minute job's run has installed its handlers
    r = cli("sweep", "factorial", "--family", "debug.fail_at_step=null", "--seeds", "1", "--dir", str(sweep_dir),
            *SLURM, "hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=0",
            *override(small, "steps=100000", "eval.every=100000", "samples_every=100000", "checkpoint_every=5"),
            cwd=tmp_path, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    [run] = manifest(sweep_dir)["runs"]
    run_dir = sweep_dir / run["run_dir"]
    status = read_status(run_dir)
    assert status["state"] == run["status"] == "interrupted", status
    assert status["reason"].startswith("SLURM time limit (00:01:00, job "), status
    assert status["step"] > 5 and (run_dir / "checkpoint" / "trainer_state.pt").exists()
    assert not (run_dir / "traceback.txt").exists()
    assert f"interrupted at step {status['step']}: SLURM time limit" in r.stdout
    assert not [n for n in NOISE if n in r.stdout + r.stderr], r.stdout + r.stderr
    r = cli("report", str(sweep_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    report = (sweep_dir / "report.md").read_text()
    assert "1 runs: 1 interrupted" in report
    [row] = [line for line in report.splitlines() if line.startswith(f"| {run['run_dir']} |")]
    assert "| interrupted |" in row and "reason: SLURM time limit" in row


def test_a_job_step_with_two_tasks_is_one_data_parallel_run(slurm_cluster, small, tmp_path):
    """`srun -n 2 grpo-ablate train`: SLURM's task ids stand in for torchrun's; the metrics are
    those of one process (tests/test_distributed.py does the same with torchrun)."""
    args = small + ["steps=2", "eval.every=1", "checkpoint_every=1", "samples_every=1", "loss_agg=token_mean",
                    "adv=lite", "kl.beta=0.1", "rollout.rng=per_row"]
    single = train(compose(args), tmp_path / "single", args)
    assert single.state == "completed"
    step = subprocess.run(["srun", "--ntasks=2", f"--partition={slurm_cluster}", "--time=10",
                           sys.executable, "-m", "grpo_ablate.cli", "train", *args, f"hydra.run.dir={tmp_path}/two"],
                          cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600)
    assert step.returncode == 0, step.stdout + step.stderr
    assert step.stdout.count("base eval accuracy") == 2, step.stdout    # rank 0 alone speaks: step 0, the end
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]
    one = strip(read_rows(tmp_path / "single" / "metrics.jsonl"))
    two = strip(read_rows(tmp_path / "two" / "metrics.jsonl"))
    assert [r["step"] for r in two] == [0, 1, 2]                        # written once, by rank 0
    for a, b in zip(one, two):
        assert a.keys() == b.keys()
        assert b == {k: pytest.approx(v, rel=1e-3, abs=1e-6) for k, v in a.items()}
    assert one[2]["kl/k3"] > 0                                           # the run did move
    assert read_status(tmp_path / "two")["state"] == "completed"


def test_a_sweep_across_contexts_runs_each_contexts_controls_on_slurm(slurm_cluster, small, tmp_path):
    """Per-context controls are ordinary jobs of the array: each context's untrained base
    and SFT control run on the cluster like its treatments, and the report reads them per context."""
    sweep_dir = tmp_path / "sweep"
    r = cli("sweep", "add-one-in", "--tricks", "no_std", "--across", "reward.wrong=0,-1", "--seeds", "1",
            "--controls", "--dir", str(sweep_dir), *SLURM, *small, cwd=tmp_path, timeout=1200)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = {x["variant"]: x["status"] for x in manifest(sweep_dir)["runs"]}
    assert runs == {f"{v}@{c}": "completed" for c in ("wrong-0", "wrong--1")
                    for v in ("base", "add-no_std", "control-base", "control-sft", "control-rft")}, runs
    assert len(list(sweep_dir.glob(".submitit/*_*/*_result.pkl"))) == 10
    report = cli("report", str(sweep_dir), "--no-figures", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "wrong-0" in report.stdout and "wrong--1" in report.stdout
