"""The command line as a user meets it: subprocesses, exit codes, messages, run dirs (refusals
mostly through typer's runner in this process: the same code, without a process's imports)."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import cli, cli_here
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows
from grpo_ablate.tricks import options


def test_help_lists_every_command_with_one_line():
    out = cli("--help")
    assert out.returncode == 0
    assert "train" in out.stdout and "Train one GRPO run" in out.stdout


@pytest.mark.parametrize("override, needle", [
    ("adv=nope", "allowed: " + ", ".join(sorted(options("adv")))),   # every option, from the registry
    ("optim.lrr=1", "unknown config key 'optim.lrr'"),
    ("optim.lr=-1", "optim.lr=-1"),
    ("optim.lr=0", "must be a number > 0"),
    ("entropy.coef=0.01", "with entropy=none would add an entropy term anyway; use entropy=bonus"),
    ("rollout.group_size=1", "group_size >= 2"),
    ("rollout.max_new_tokens=0", "rollout.max_new_tokens=0"),
    ("model.path=/definitely/not/here", "does not exist"),
    ("model=hf", "model.path is required"),
    ("kl.estimator=k4", "allowed: abs, k1, k1_st, k2, k3, k3_iw, k3_st"),
    ("task.level=insane", "easy, medium, hard"),
    ("seed=oops=1", "could not parse"),
    ("dual_clip.c=0.5", "must be a number > 1"),
    ("overlong=soft_punish overlong.buffer=0", "overlong.buffer=0"),
    ("adv=lite adv.std_of=nope", "allowed: raw, centered"),
    ("sampling=dynamic_group sampling.g_max=2", "sampling.g_max=2 is not allowed"),
    ("kl=none kl_weight=entropy", "kl_weight=entropy weights the KL term, but kl=none has none"),
    # a mistyped knob is never silently ignored: it names the knobs the option has
    ("+adv.epz=0.1", "adv.epz is not a setting of adv=grpo; allowed: eps"),
    ("+clip.eps_hihg=0.3", "clip.eps_hihg is not a setting of clip=symmetric; allowed: eps_high, eps_low"),
    ("overlong=soft_punish +overlong.bufer=3", "overlong.bufer is not a setting of overlong=soft_punish; "
                                               "allowed: buffer, factor"),
    ("+clip.dual_clip_c=3", "(it is set by dual_clip.c)"),
    ("+updates.epochz=2", "updates.epochz is not a setting of updates=single"),
])
def test_bad_input_is_one_line_exit_2_and_no_run_dir(tmp_path, override, needle):
    if override in IN_A_PROCESS:
        out = cli("train", *override.split(), cwd=tmp_path)
        code, stdout, stderr = out.returncode, out.stdout, out.stderr
    else:   # the same command in this process (typer's runner): no 3-4 s of imports per case
        result = cli_here("train", *override.split(), cwd=tmp_path)
        assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
        code, stdout, stderr = result.exit_code, result.stdout, result.stderr
    assert code == 2, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert needle in lines[0]
    assert "Traceback" not in stderr + stdout
    assert not any(tmp_path.iterdir())                  # nothing half-written


# these cases run as a user runs them, in a process of their own (exit status, stderr as printed)
IN_A_PROCESS = {"adv=nope", "optim.lrr=1", "+adv.epz=0.1"}


@pytest.mark.full
def test_cfg_job_prints_config_and_writes_nothing(tmp_path):
    out = cli("train", "--cfg", "job", "adv=dr_grpo", cwd=tmp_path)
    assert out.returncode == 0 and "name: dr_grpo" in out.stdout
    assert not (tmp_path / "runs").exists()


def test_train_end_to_end_with_wandb_offline(small, tmp_path):
    env = {"WANDB_API_KEY": None, "WANDB_MODE": None, "HOME": str(tmp_path)}  # no key anywhere: offline by itself
    out = cli("train", *[o for o in small if not o.startswith("logger")], "logger=wandb",
              f"hydra.run.dir={tmp_path}/run", cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "base eval accuracy" in out.stdout and "-> final" in out.stdout
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert json.loads((tmp_path / "run" / "status.json").read_text())["wandb_id"]


def test_diverged_run_exits_3(small, tmp_path):
    out = cli("train", *small, "steps=6", "optim.lr=1e30", "optim.weight_decay=0.5", f"hydra.run.dir={tmp_path}/run",
              cwd=tmp_path)
    assert out.returncode == 3, out.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "diverged"


def test_multirun_launches_one_run_per_seed(small, tmp_path):
    out = cli("train", "-m", *small, "steps=1", "seed=0,1", f"hydra.sweep.dir={tmp_path}/sweep",
              "hydra.sweep.subdir=seed${seed}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    for seed in (0, 1):
        status = json.loads((tmp_path / "sweep" / f"seed{seed}" / "status.json").read_text())
        assert status["state"] == "completed"
        assert f"seed={seed}" in (tmp_path / "sweep" / f"seed{seed}" / ".hydra" / "overrides.yaml").read_text()


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]


def test_resume_after_kill_equals_uninterrupted(small, tmp_path):
    args = [*small, "steps=40", "checkpoint_every=5", "eval.every=10", "samples_every=5"]
    full = cli("train", *args, f"hydra.run.dir={tmp_path}/full", cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-2000:]

    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "grpo_ablate.cli", "train", *args,
                             f"hydra.run.dir={killed}"], cwd=tmp_path, env=os.environ.copy(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:   # kill once a checkpoint exists
        if (killed / "checkpoint" / "trainer_state.pt").exists():
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    status = json.loads((killed / "status.json").read_text())
    assert status["state"] == "running" and status["step"] < 40     # really killed mid-run

    resumed = cli("train", "--resume", str(killed), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming" in resumed.stdout
    assert _strip(read_rows(killed / "metrics.jsonl")) == _strip(read_rows(tmp_path / "full" / "metrics.jsonl"))
    assert json.loads((killed / "status.json").read_text())["state"] == "completed"
    # a finished run is never redone
    again = cli("train", "--resume", str(killed), cwd=tmp_path)
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_resume_of_a_dir_that_is_not_a_run(tmp_path):
    out = cli("train", "--resume", str(tmp_path), cwd=tmp_path)
    assert out.returncode == 2 and "not a grpo-ablate run dir" in out.stderr


def test_tricks_command_lists_the_catalogue(tmp_path):
    out = cli("tricks", "--format", "json")
    assert out.returncode == 0
    rows = json.loads(out.stdout)
    names = {r["name"] for r in rows}
    assert {"clip_higher", "token_mean", "kl_adaptive", "overlong_filter"} <= names
    assert all(r["verdict"] and r["source"] and r["what"] and r["cost"] for r in rows)
    md = cli("tricks", "--format", "md").stdout
    assert md.startswith("| trick |") and "`clip_higher`" in md
    bad = cli("tricks", "--format", "xml")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: --format 'xml' is not allowed; allowed: table, json, md"


def test_docs_catalogue_is_current():
    from conftest import REPO
    md = cli("tricks", "--format", "md").stdout.strip()
    assert md in (REPO / "docs" / "tricks.md").read_text(), "regenerate docs/tricks.md"
