"""Faults, damaged state and bad input: every case one line on stderr, no traceback,
and the run or sweep dir byte for byte as it was. Through the real CLI: typer's CliRunner
where the command refuses before Hydra runs (fast), a subprocess where a run is trained."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from typer.testing import CliRunner

from conftest import cli
from grpo_ablate.cli.app import app
from grpo_ablate.rundir.lock import DirLock
from grpo_ablate.rundir.paths import writable_problem
from report_fixtures import LOO, LOO_CONTRASTS, make_sweep


def snapshot(path):
    """Every file under `path` (hidden ones too) with a hash of its bytes."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def refused(result, needle, code=2):
    """A CliRunner or subprocess result: exit `code`, one `error:` line holding `needle`, no traceback."""
    exit_code = result.exit_code if hasattr(result, "exit_code") else result.returncode
    out = result.stdout + result.stderr
    assert exit_code == code, out
    assert "Traceback" not in out, out
    assert getattr(result, "exception", None) is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def run_cli(tmp_path, monkeypatch):
    """The CLI in this process, from tmp_path (refusals never reach Hydra, so this is cheap)."""
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


# ------------------------------------------------------------------------------ every user value
@pytest.mark.parametrize("args, needle", [
    (["sweep", "leave-one-out", "--jobs", "0"], "--jobs 0 is not allowed; it must be an integer >= 1"),
    (["sweep", "leave-one-out", "--steps", "0"], "--steps 0 is not allowed"),
    (["sweep", "leave-one-out", "--max-runs", "0"], "--max-runs 0 is not allowed"),
    (["sweep", "leave-one-out", "--seeds", "auto", "--max-seeds", "0"], "--max-seeds 0 is not allowed"),
    (["sweep", "leave-one-out", "--seeds", "auto", "--effect", "2"], "--effect 2.0 is not allowed; it must be "
                                                                     "a number in (0, 1]"),
    (["sweep", "leave-one-out", "--seeds", "auto", "--effect", "inf"], "--effect inf is not allowed"),
    (["doctor", "--jobs", "0"], "--jobs 0 is not allowed"),
    (["doctor", "--steps", "0"], "--steps 0 is not allowed"),
    (["doctor", "--max-runs", "0"], "--max-runs 0 is not allowed"),
])
def test_count_options_are_refused_before_the_training_stack_is_imported(tmp_path, args, needle):
    """sweep and doctor check their own options first: no torch import, so a refusal is quick."""
    probe = textwrap.dedent(f"""
        import sys
        from grpo_ablate.cli.app import main
        sys.argv = ["grpo-ablate", *{args!r}]
        try:
            main()
        except SystemExit as end:
            print("torch imported:", "torch" in sys.modules, "exit:", end.code)
    """)
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "torch imported: False exit: 2" in out.stdout, out.stdout + out.stderr
    assert out.stderr.strip().startswith("error: ") and needle in out.stderr and len(out.stderr.splitlines()) == 1
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("override, needle", [
    # `+key=value` that nothing reads: refused with the keys that exist there, never kept and ignored
    ("+rollout.temperature=0", "no setting rollout.temperature exists, and nothing would read it; temperature is a "
                               "trick family"),
    ("+rollout.top_q=0.5", "keys of 'rollout': backend"),
    ("+optim.foo=1", "keys of 'optim': betas, lr"),
    ("rollout.temperature=0", "unknown config key 'rollout.temperature'; temperature is a trick family"),
    # the keys listed are those of the option chosen on the same line, not of the family's default
    ("rollout_correction=tv_filter rollout_correction.bound=1",
     "keys of 'rollout_correction': clamp_high, clamp_low, high, low, name"),
    ("+adv.eps=0.1", "adv.eps exists already; set it without the +"),
    ("+task.foo=1", "task.foo is not a setting of task=arithmetic; allowed: level, trace, eval_size"),
    # types and ranges from the trick registry, and the tasks' own
    ("clip=clip_cov clip.cov_low=5 clip.cov_high=1", "leave an empty band"),
    ("clip=clip_cov clip.ratio=1.5", "clip.ratio=1.5 is not allowed"),
    ("clip=kl_cov clip.kl_coef=abc", "clip.kl_coef='abc' is not allowed"),
    ("adv=gdpo adv.weights=[1,2]", "it must map names to numbers"),
    ("adv=gdpo adv.weights={bogus:2}", "names: task_reward"),
    ("adv=gpg adv.f_norm=0", "adv.f_norm=0 is not allowed"),
    ("task.eval_size=0", "task.eval_size=0 is not allowed; it must be an integer >= 1"),
    ("task.eval_size=2514", "task.eval_size=2514 is more than the 2513 held-out problems of task.level=easy"),
    ("task.trace=maybe", "task.trace='maybe' is not allowed; allowed: true, false"),
    ("model.disable_dropout=maybe", "allowed: true, false"),
])
def test_train_refuses_bad_values_before_anything_is_written(run_cli, tmp_path, override, needle):
    refused(run_cli("train", *override.split()), needle)
    assert not any(tmp_path.iterdir())


def test_a_key_the_code_reads_may_still_be_added(run_cli):
    """`+model.dtype` is read with a default where the config lacks it: an addition, not a typo."""
    out = run_cli("train", "+model.dtype=bfloat16", "--cfg", "job")
    assert out.exit_code == 0 and "dtype: bfloat16" in out.stdout


@pytest.mark.parametrize("text, needle", [
    ("mode: leave-one-out\nmax_seeds: abc\n", "max_seeds: 'abc' is not allowed; it must be an integer >= 1"),
    ("mode: leave-one-out\neffect: abc\n", "effect: 'abc' is not allowed"),
    ("mode: leave-one-out\neffect: 2\n", "effect: 2 is not allowed"),
    ("mode: leave-one-out\nsteps: 0\n", "steps: 0 is not allowed"),
    ("mode: leave-one-out\nmax_runs: -1\n", "max_runs: -1 is not allowed"),
    ("mode: leave-one-out\ncontrols: maybe\n", "controls: 'maybe' is not allowed; allowed: true, false"),
    ("mode: leave-one-out\ntricks: clip_higher\n", "tricks: 'clip_higher' is not allowed; it must be a list of texts"),
    ("mode: leave-one-out\noverrides: [5]\n", "overrides: [5] is not allowed; it must be a list of texts"),
    ("mode: factorial\nfamilies: {adv: 5}\n", "families: {'adv': 5} is not allowed"),
    ("mode: leave-one-out\nsteps: 5\nsteps: 6\n", "key steps is given twice"),
    ("mode: variants\nvariants:\n  a: []\n  b: {overrides: [], expect: 5}\n", "expect 5 is not a verdict"),
    ("mode: variants\nvariants:\n  a: []\n  b: [optim.lr=1e-3]\n  b: [optim.lr=1e-5]\n", "key b is given twice"),
    ("mode: variants\nvariants:\n  a: []\n  control-base: [optim.lr=1e-3]\n", "variant name control-base is not "
                                                                          "allowed"),
])
def test_sweep_file_fields_are_checked(run_cli, tmp_path, text, needle):
    (tmp_path / "s.yaml").write_text(text)
    before = snapshot(tmp_path)
    refused(run_cli("sweep", "file", "s.yaml", "--dir", tmp_path / "sweep"), needle)
    assert snapshot(tmp_path) == before and not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("args, needle", [
    (["--threshold", "patience=-1"], "--threshold patience=-1 is not allowed; it must be an integer >= 1"),
    (["--threshold", "kl_drift_threshold=nan"], "--threshold kl_drift_threshold=nan is not allowed"),
    (["--threshold", "length_cap_frac=2"], "it must be a number in (0, 1]"),
    (["--effect", "2"], "--effect 2.0 is not allowed for eval/accuracy"),
    (["--effect", "inf"], "--effect inf is not allowed"),
    (["--summary", "last_k", "--last-k", "0"], "--last-k 0 is not allowed"),
])
def test_report_options_are_checked_and_nothing_is_written(run_cli, tmp_path, args, needle):
    sweep = make_sweep(tmp_path / "sweep", LOO, contrasts=LOO_CONTRASTS)
    before = snapshot(sweep)
    refused(run_cli("report", sweep, *args), needle)
    assert snapshot(sweep) == before


@pytest.mark.full
def test_report_leaves_out_a_run_whose_metric_is_not_finite_and_says_so(run_cli, tmp_path):
    sweep = make_sweep(tmp_path / "sweep", LOO, contrasts=LOO_CONTRASTS)
    metrics = sweep / "all-s0" / "metrics.jsonl"   # a NaN eval is written as null (rundir.finite_or_none)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    rows[-1]["eval/accuracy"] = None
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run_cli("report", sweep)
    assert out.exit_code == 0, out.stdout + out.stderr
    assert "`all-s0`: `eval/accuracy` is not finite at step 40: this run is left out" in out.stdout


# ------------------------------------------------------------------------------ damaged sweep state
def _sweep_with_runs(tmp_path):
    """A finished sweep dir as `sweep` leaves it (manifest and run dirs agree)."""
    return make_sweep(tmp_path / "sweep", LOO, contrasts=LOO_CONTRASTS)


@pytest.mark.parametrize("damage, needle", [
    (lambda d: (d / "manifest.json").write_text("[]"), "manifest.json is damaged (not a JSON object)"),
    (lambda d: (d / "manifest.json").write_text("{}"), "manifest.json is damaged (no list of runs)"),
    (lambda d: (d / "manifest.json").write_text(""), "manifest.json is empty"),
    (lambda d: (d / "manifest.json").write_text((d / "manifest.json").read_text()[:200]),
     "manifest.json is truncated"),
    (lambda d: (d / "manifest.json").write_text(
        (d / "manifest.json").read_text().replace('"overrides": []}', '"no_overrides": []}', 1)),
     "run all-s0 has no valid overrides"),
    (lambda d: (d / "drop-a-s1" / "status.json").write_text('{"state": "compl'),
     "run drop-a-s1: status.json is truncated; re-run it with `grpo-ablate sweep --resume"),
    (lambda d: (d / "drop-a-s1" / "status.json").write_text("{}"), "run drop-a-s1: status.json is not a run status"),
])
def test_resume_of_a_damaged_sweep_is_one_line_and_changes_nothing(run_cli, tmp_path, damage, needle):
    sweep = _sweep_with_runs(tmp_path)
    damage(sweep)
    before = snapshot(sweep)
    line = refused(run_cli("sweep", "--resume", sweep), needle)
    if "status.json" in needle:
        assert line.endswith("--rerun drop-a-s1`")
    assert snapshot(sweep) == before


def test_resume_of_a_finished_sweep_writes_nothing(run_cli, tmp_path):
    sweep = _sweep_with_runs(tmp_path)
    before = snapshot(sweep)
    out = run_cli("sweep", "--resume", sweep)
    assert out.exit_code == 0, out.stdout + out.stderr
    assert "nothing to do" in out.stdout
    assert snapshot(sweep) == before


@pytest.mark.parametrize("args, needle", [
    (["steps=5"], "drop steps=5"),                        # an override, not read as the MODE
    (["--rerun", "nope-s0"], "--rerun nope-s0: not a run of"),
])
def test_resume_options_are_checked(run_cli, tmp_path, args, needle):
    sweep = _sweep_with_runs(tmp_path)
    before = snapshot(sweep)
    refused(run_cli("sweep", "--resume", sweep, *args), needle)
    assert snapshot(sweep) == before


def hold_lock(directory, what="sweep dir"):
    """A live grpo-ablate process holding `directory`'s lock (until killed)."""
    code = (f"import time; from grpo_ablate.rundir.lock import DirLock; "
            f"DirLock({str(directory)!r}, {what!r}).acquire(); print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_sweep_dir_held_by_a_live_process_is_refused(run_cli, tmp_path):
    sweep = _sweep_with_runs(tmp_path)
    holder = hold_lock(sweep)
    try:
        before = snapshot(sweep)
        refused(run_cli("sweep", "--resume", sweep), f"is in use by process {holder.pid} on this machine")
        assert snapshot(sweep) == before
    finally:
        holder.kill()           # killed: its lock file stays behind, naming it
        holder.wait()
    out = run_cli("sweep", "--resume", sweep)   # its process is gone: the lock is taken over, and released
    assert out.exit_code == 0 and f"its process {holder.pid} is gone" in out.stdout, out.stdout
    assert not (sweep / ".lock").exists()


def test_a_stale_lock_naming_a_live_pid_is_not_called_gone(run_cli, tmp_path):
    sweep = _sweep_with_runs(tmp_path)   # pid 1 (init) is alive and holds no lock here
    (sweep / ".lock").write_text(json.dumps({"pid": 1, "host": os.uname().nodename}))
    out = run_cli("sweep", "--resume", sweep)
    assert out.exit_code == 0 and "its process 1 no longer holds it" in out.stdout, out.stdout
    assert "is gone" not in out.stdout and not (sweep / ".lock").exists()


# ------------------------------------------------------------------------------ the lock itself
def test_dir_lock_is_reentrant_takes_over_a_dead_holder_and_refuses_a_live_one(tmp_path):
    from grpo_ablate.errors import ConfigError

    with DirLock(tmp_path, "run dir") as outer:
        with DirLock(tmp_path, "run dir"):       # the CLI, then its trainer, in one process
            pass
        assert outer.path.exists()
    assert not (tmp_path / ".lock").exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / ".lock").write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename}))
    said = []
    with DirLock(tmp_path, "run dir", said.append):
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    assert said and "is gone" in said[0]
    (tmp_path / ".lock").write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
    with pytest.raises(ConfigError, match="in use by process 1 on elsewhere"):
        DirLock(tmp_path, "run dir").acquire()


@pytest.mark.parametrize("left, said", [
    ("garbage", "the process that left it is gone"),            # was "its process None is gone"
    ("", None),                                                 # an empty file: nobody's, taken silently
    # pid 1 (init) is alive, but holds no lock here: not called gone
    (json.dumps({"pid": 1, "host": os.uname().nodename}),
     "its process 1 no longer holds it (that pid is alive, but does not hold the lock)"),
    (json.dumps({"pid": -1, "host": os.uname().nodename}), "its process -1 is gone"),
])
def test_only_a_process_holding_the_lock_counts_whatever_the_file_says(tmp_path, left, said):
    (tmp_path / ".lock").write_text(left)      # a fresh file too: its age does not matter
    heard = []
    with DirLock(tmp_path, "run dir", heard.append):
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    assert heard == ([f"{tmp_path}/.lock: {said}; taking the run dir over"] if said else [])
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_lock_that_is_a_directory_is_one_line_and_nothing_is_left(run_cli, tmp_path):
    sweep = _sweep_with_runs(tmp_path)
    (sweep / ".lock").mkdir()
    before = snapshot(sweep)
    refused(run_cli("sweep", "--resume", sweep), f"{sweep}/.lock is a directory, not sweep dir's lock file; "
                                                 "remove it")
    assert snapshot(sweep) == before and sorted(p.name for p in sweep.glob(".lock*")) == [".lock"]


def test_two_processes_racing_for_a_stale_lock_never_both_hold_it(tmp_path):
    """Eight processes take over the same stale lock at once, each holding it a moment: at most one
    holds it at a time (each appends `in`/`out` to a journal under the lock), and none is lost."""
    (tmp_path / ".lock").write_text(json.dumps({"pid": 999999, "host": os.uname().nodename}))
    journal = tmp_path.parent / f"{tmp_path.name}.journal"
    code = textwrap.dedent(f"""
        import time
        from grpo_ablate.errors import ConfigError
        from grpo_ablate.rundir.lock import DirLock
        while True:
            try:
                lock = DirLock({str(tmp_path)!r}, "run dir").acquire()
                break
            except ConfigError:
                time.sleep(0.01)
        with open({str(journal)!r}, "a") as f:
            f.write("in\\n"); f.flush(); time.sleep(0.05); f.write("out\\n")
        lock.release()
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(8)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    assert journal.read_text() == "in\nout\n" * 8
    assert not (tmp_path / ".lock").exists()


@pytest.mark.full
def test_unwritable_places_are_named_with_the_setting_that_moves_them(run_cli, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("GRPO_ABLATE_CACHE", str(blocker / "cache"))
    refused(run_cli("train"), f"cannot write the model cache {blocker}/cache: {blocker} is a file, not a "
                              "directory; set GRPO_ABLATE_CACHE")
    monkeypatch.delenv("GRPO_ABLATE_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(blocker))   # an unusable home: the default cache is under it
    refused(run_cli("train"), "set GRPO_ABLATE_CACHE (or model.cache_dir) to a writable directory")
    monkeypatch.setenv("GRPO_ABLATE_CACHE", str(tmp_path / "cache"))
    refused(run_cli("train", f"hydra.run.dir={blocker}/run"), f"cannot write the run dir {blocker}/run")
    refused(run_cli("sweep", "leave-one-out", "--dir", blocker / "sweep"), f"cannot write the sweep dir {blocker}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_writable_problem_names_a_read_only_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: False)   # as a read-only file system answers
    assert writable_problem(tmp_path / "runs") == f"{tmp_path} is not writable"


# ------------------------------------------------------------------------------ damaged run state
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, cache_dir):
    """One small trained run (4 steps, checkpoints every 2), copied per test."""
    from conftest import SMALL

    where = tmp_path_factory.mktemp("finished")
    env = {"GRPO_ABLATE_CACHE": str(cache_dir)}
    out = cli("train", *SMALL, f"hydra.run.dir={where}/run", cwd=where, env=env)   # (a subprocess: Hydra runs)
    assert out.returncode == 0, out.stderr[-2000:]
    return where / "run"


@pytest.fixture
def run_copy(finished_run, tmp_path):
    shutil.copytree(finished_run, tmp_path / "run")
    return tmp_path / "run"


def _truncate(path, keep=100):
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize("damage, args, needle", [
    (None, ["optim.lr=1e-3"], "the config differs from the one it was started with"),
    (lambda d: shutil.rmtree(d / "checkpoint"), ["steps=6"],
     "is completed at step 4 and has no checkpoint to continue to steps=6 from; a finished result is never "
     "restarted"),
    (lambda d: _truncate(d / "checkpoint" / "trainer_state.pt"), ["steps=6"],
     "checkpoint/ trainer_state.pt is damaged"),
    (lambda d: _truncate(d / "checkpoint" / "model.safetensors", 2000), ["steps=6"],
     "checkpoint/ model.safetensors is cut short"),
    (lambda d: _truncate(d / "status.json", 30), [], "status.json is truncated; start it over with "
                                                     "`grpo-ablate train --resume"),
    (lambda d: (d / "status.json").write_text("[]"), [], "status.json is not a run status"),
    (lambda d: (d / "overrides.yaml").write_text("[a, b"), [], "overrides.yaml cannot be read as YAML"),
    (lambda d: (d / "overrides.yaml").write_text("steps: 4"), [], "overrides.yaml is not a YAML list of overrides; "
                                                                  "restore it from"),
    (None, ["--restart"], "is completed at step 4: a finished result is never restarted"),
])
def test_resume_of_a_damaged_or_finished_run_is_refused_and_changes_nothing(run_cli, run_copy, damage, args,
                                                                             needle):
    if damage is not None:
        damage(run_copy)
    before = snapshot(run_copy)
    refused(run_cli("train", "--resume", run_copy, *args), needle)
    assert snapshot(run_copy) == before          # not even Hydra's .hydra/


def test_a_new_run_into_a_dir_that_holds_one_is_refused_before_hydra_writes_there(run_cli, run_copy):
    from conftest import SMALL

    before = snapshot(run_copy)
    refused(run_cli("train", *SMALL, f"hydra.run.dir={run_copy}"), f"run dir {run_copy} already holds a run "
                                                                   "(completed); continue it with")
    assert snapshot(run_copy) == before


def test_a_resume_with_nothing_to_do_changes_nothing(run_cli, run_copy):
    before = snapshot(run_copy)
    out = run_cli("train", "--resume", run_copy)
    assert out.exit_code == 0 and "is already completed at step 4; nothing to do" in out.stdout, out.stderr
    assert snapshot(run_copy) == before


def test_a_run_stopped_before_its_first_checkpoint_restarts_only_when_asked(run_copy, cache_dir):
    status = json.loads((run_copy / "status.json").read_text())
    (run_copy / "status.json").write_text(json.dumps({**status, "state": "interrupted", "step": 1}))
    shutil.rmtree(run_copy / "checkpoint")
    before = snapshot(run_copy)
    out = cli("train", "--resume", run_copy, cwd=run_copy.parent)
    refused(out, "stopped at step 1 (interrupted) before its first checkpoint, so it cannot be continued; start "
                 "it over with")
    assert snapshot(run_copy) == before
    again = cli("train", "--resume", run_copy, "--restart", cwd=run_copy.parent)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads((run_copy / "status.json").read_text())["state"] == "completed"
    steps = [json.loads(line)["step"] for line in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]
    assert not (run_copy / ".lock").exists()


def test_restart_belongs_to_resume(run_cli, tmp_path):
    refused(run_cli("train", "--restart"), "--restart belongs to --resume RUN_DIR")
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------ two processes at once
@pytest.mark.slow
def test_two_trains_into_one_run_dir_one_wins_and_its_metrics_hold_each_step_once(small, tmp_path):
    """Started at the same moment: exactly one trains; the other exits non-zero with one line."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "grpo_ablate.cli", "train", *small, "steps=6", f"hydra.run.dir={run_dir}"]
    both = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    ends = [(p.returncode, out, err) for p, (out, err) in ((p, p.communicate(timeout=600)) for p in both)]
    won = [e for e in ends if e[0] == 0]
    lost = [e for e in ends if e[0] != 0]
    assert len(won) == 1 and len(lost) == 1, ends
    code, out, err = lost[0]
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, err
    # the holder's pid is named once it has written it; before that (the OS lock is taken first) "another process"
    assert lines[0].startswith("error: run dir") and ("is in use by process" in lines[0]
                                                     or "is in use by another process" in lines[0])
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(7))
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"
    assert not (run_dir / ".lock").exists()


@pytest.mark.slow
def test_a_second_train_while_one_runs_is_refused_and_the_first_completes(small, tmp_path):
    run_dir = tmp_path / "run"
    long = ["steps=300", "eval.every=100", "checkpoint_every=100", "samples_every=100"]   # outlives the second
    command = [sys.executable, "-m", "grpo_ablate.cli", "train", *small, *long, f"hydra.run.dir={run_dir}"]
    first = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (run_dir / "status.json").exists() and time.time() < deadline:   # it is training
        time.sleep(0.05)
    second = cli("train", "--resume", run_dir, cwd=tmp_path)
    refused(second, f"run dir {run_dir} is in use by process {first.pid} on this machine")
    out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-2000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(301))


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])   # kill, and Ctrl-C alike
def test_a_stop_during_the_warm_start_leaves_no_run_dir_and_says_how_to_start_again(tmp_path, signum):
    """Stopped before the run began (building the model cache): no --resume to offer, nothing kept;
    the command to start again trains into the user's own dir."""
    from conftest import SMALL

    run_dir = tmp_path / "run"
    env = {**os.environ, "GRPO_ABLATE_CACHE": str(tmp_path / "fresh-cache")}   # the warm start takes a while
    proc = subprocess.Popen([sys.executable, "-m", "grpo_ablate.cli", "train", *SMALL, f"hydra.run.dir={run_dir}"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "warm-starting" in line:
                break
        time.sleep(1)
        proc.send_signal(signum)
        output, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == (130 if signum == signal.SIGINT else -signum), output   # as a shell reports Ctrl-C
    name = signal.Signals(signum).name
    assert f"interrupted: {name}; it had not started, nothing was kept: run `grpo-ablate train" in output, output
    assert f"hydra.run.dir={run_dir}` again" in output, output
    assert "--resume" not in output and "Traceback" not in output
    assert not run_dir.exists()


def test_a_file_system_without_locks_is_said_and_the_run_goes_on(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    said = []
    with DirLock(tmp_path, "run dir", said.append):
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    assert said == [f"{tmp_path}/.lock: this file system cannot lock files (No locks available); nothing stops a "
                    "second process from writing this run dir"]
    assert not (tmp_path / ".lock").exists()
