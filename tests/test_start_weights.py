"""One sweep, two starting points: each run records the digest of the weights it started from (LoRA's
base included), and the report and `sweep --resume` name the runs that started from other weights
than the sweep's other runs of their model, never averaging them (rundir/starts.py)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, cli
from grpo_ablate.rundir.starts import other_starts, recorded_start
from report_fixtures import LOO, LOO_CONTRASTS, make_sweep
from test_faults import run_cli  # noqa: F401 (a fixture)
from test_report_load import _report

ENTRY = "tiny-062a466c0eaad440"


def _record(run_dir, weights, model=ENTRY):
    status = json.loads((run_dir / "status.json").read_text())
    status["start"] = {"weights": weights, "model": model}
    (run_dir / "status.json").write_text(json.dumps(status))


def _two_starts(tmp_path, odd=("drop-a-s1", "drop-b-s1")):
    """The LOO sweep (4 variants x 3 seeds) with every run recording its start: `odd` from other weights."""
    path = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    for run_dir in sorted(p for p in path.iterdir() if p.is_dir()):
        _record(run_dir, "1111111111111111" if run_dir.name in odd else "9cbf02133fb7ae87")
    return path


def test_other_starts_are_the_runs_off_their_models_usual_weights():
    starts = {"a": {"weights": "x", "model": "m"}, "b": {"weights": "y", "model": "m"},
              "c": {"weights": "x", "model": "m"}, "d": None,                       # d: not recorded
              "e": {"weights": "z", "model": "other"}}                               # another model: its own
    assert [(o.run, o.usual, o.usual_runs, o.runs) for o in other_starts(starts)] == [("b", "x", 2, 3)]
    tie = {"a": {"weights": "y", "model": "m"}, "b": {"weights": "x", "model": "m"}}
    assert [o.run for o in other_starts(tie)] == ["b"]                              # a tie: the first run's
    assert recorded_start({"state": "completed", "step": 2}) is None                 # from before the record
    assert recorded_start({"start": {"weights": 3}}) is None


def test_the_report_leaves_out_and_names_the_runs_that_started_elsewhere(tmp_path):
    path = _two_starts(tmp_path)
    done, report, warnings = _report(path)
    why = ("not this sweep's start: it started from the weights 1111111111111111 of tiny-062a466c0eaad440, where "
           "10 of the sweep's 12 runs of that model started from 9cbf02133fb7ae87")
    assert warnings == [f"warning: {path / name}: {why} (another machine's model cache?); the report goes on without "
                        "this run" for name in ("drop-a-s1", "drop-b-s1")]
    rows = {r["variant"]: r for r in report["variants"]}
    assert rows["drop-a"]["final"]["n"] == 2 and rows["all"]["final"]["n"] == 3   # never averaged in
    assert rows["drop-a"]["final"]["mean"] == pytest.approx(np.mean([LOO["drop-a"]["final"][s] for s in (0, 2)]))
    text = (path / "report.md").read_text()
    assert ("2 run(s) started from other weights than the sweep's other runs of their model: drop-a-s1 "
            "(1111111111111111), drop-b-s1 (1111111111111111); left out, never averaged") in text


def test_runs_that_record_no_start_are_said_and_still_reported(tmp_path):
    path = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)   # run dirs from before the record
    done, report, warnings = _report(path)
    assert warnings == [] and "started from" not in (path / "report.md").read_text()
    _record(path / "all-s0", "9cbf02133fb7ae87")                         # one run records, the rest do not
    done, report, warnings = _report(path)
    assert warnings == [] and {r["variant"]: r for r in report["variants"]}["all"]["final"]["n"] == 3
    assert "what 11 run(s) started from is not recorded" in (path / "report.md").read_text()


def test_sweep_resume_names_the_runs_that_started_elsewhere(run_cli, tmp_path):  # noqa: F811
    path = _two_starts(tmp_path)
    out = run_cli("sweep", "--resume", path)
    assert out.exit_code == 0, out.stdout
    lines = [line for line in out.stdout.splitlines() if line.startswith("warning: ")]
    assert [line.split(":")[1].strip() for line in lines] == ["drop-a-s1", "drop-b-s1"]
    assert all("started from the weights 1111111111111111" in line and "never averaged" in line for line in lines)


# ------------------------------------------------------------------------------ two machines, one sweep
# The embedded model warm-started in a process of its own, into the cache dir GRPO_ABLATE_CACHE names
WARM_START = """
import sys
from grpo_ablate.config.compose import compose
from grpo_ablate.models import ensure_warm_started
from grpo_ablate.tasks import build_task
cfg = compose(sys.argv[1:])
ensure_warm_started(cfg.model, build_task(cfg.task), log=lambda *_: None)
"""


def _overrides():
    from conftest import SMALL

    return [o for o in SMALL if not o.startswith(("model.warmup.steps=", "steps="))] + ["model.warmup.steps=20",
                                                                                        "steps=2"]


@pytest.fixture(scope="module")
def two_machines(tmp_path_factory):
    """Machine A's model cache and machine B's, each with the embedded model warm-started there: A with
    this CPU's kernels, B with ATEN_CPU_CAPABILITY=default (another machine's kernels). Where the two
    give the same weights (a CPU whose own kernels are the default ones), B's are perturbed, as another
    machine's would differ. A run reaches either through one path (`cache`, a link), as nodes whose
    caches are not shared name theirs alike: the config, and so the run's hash, is the same."""
    import torch
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("machines")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    builds = [subprocess.Popen([sys.executable, "-c", WARM_START, *_overrides()], cwd=root,
                               env={**env, "GRPO_ABLATE_CACHE": str(root / name), **extra})
              for name, extra in (("a", {}), ("b", {"ATEN_CPU_CAPABILITY": "default"}))]
    assert [b.wait(timeout=300) for b in builds] == [0, 0]
    (weights_a,), (weights_b,) = ((root / name).glob("tiny-*/model.safetensors") for name in ("a", "b"))
    if weights_a.read_bytes() == weights_b.read_bytes():
        tensors = load_file(weights_b)
        first = sorted(tensors)[0]
        tensors[first] = tensors[first] + torch.full_like(tensors[first], 1e-3)
        save_file(tensors, weights_b, metadata={"format": "pt"})
    (root / "cache").symlink_to(root / "a")
    return root


def _on_machine(root, name):
    (root / "cache").unlink()
    (root / "cache").symlink_to(root / name)
    return {"GRPO_ABLATE_CACHE": str(root / "cache"), "OMP_NUM_THREADS": "1"}


@pytest.mark.full
def test_a_sweep_whose_runs_started_from_two_warm_starts_names_them_and_never_averages_them(two_machines, tmp_path):
    sweep = tmp_path / "sweep"
    out = cli("sweep", "add-one-in", "--tricks", "batch_norm", "--seeds", "2", "--no-controls", "--launcher", "basic",
              "--dir", str(sweep), *_overrides(), cwd=tmp_path, env=_on_machine(two_machines, "a"))
    assert out.returncode == 0 and "warning:" not in out.stdout, out.stdout + out.stderr
    # one run lands on machine B (its own cache at the same path): rerun there, from B's warm start
    out = cli("sweep", "--resume", str(sweep), "--rerun", "add-batch_norm-s1", cwd=tmp_path,
              env=_on_machine(two_machines, "b"))
    assert out.returncode == 0, out.stdout + out.stderr
    named = [line for line in out.stdout.splitlines() if line.startswith("warning: ")]
    assert len(named) == 1 and named[0].startswith("warning: add-batch_norm-s1: it started from the weights "), named
    starts = {d.name: json.loads((d / "status.json").read_text())["start"] for d in sweep.glob("*-s*")}
    assert len({s["model"] for s in starts.values()}) == 1                       # one model asked for ...
    assert {n for n, s in starts.items() if s != starts["base-s0"]} == {"add-batch_norm-s1"}   # ... two starts

    out = cli("report", str(sweep), "--no-figures", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    warnings = [line for line in out.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "add-batch_norm-s1: not this sweep's start" in warnings[0], out.stderr
    report = json.loads((sweep / "report.json").read_text())
    rows = {r["variant"]: r for r in report["variants"]}
    assert rows["add-batch_norm"]["final"]["n"] == 1 and rows["base"]["final"]["n"] == 2   # never averaged in
    assert f"add-batch_norm-s1 ({starts['add-batch_norm-s1']['weights']})" in (sweep / "report.md").read_text()


@pytest.mark.full
def test_a_resume_that_would_load_another_start_is_refused(two_machines, tmp_path):
    """A KL run loads its reference from the start again when it resumes: on another machine's warm start
    it would be anchored to another model than it began with."""
    run = tmp_path / "run"
    out = cli("train", *_overrides(), "kl=fixed", f"hydra.run.dir={run}", cwd=tmp_path,
              env=_on_machine(two_machines, "a"))
    assert out.returncode == 0, out.stdout + out.stderr
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    out = cli("train", "--resume", str(run), "steps=4", cwd=tmp_path, env=_on_machine(two_machines, "b"))
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: cannot resume {run}: it started "
                                                                          "from the weights "), out.stderr
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before   # nothing written
    out = cli("train", "--resume", str(run), "steps=4", cwd=tmp_path, env=_on_machine(two_machines, "a"))
    assert out.returncode == 0, out.stdout + out.stderr                               # where its start is: on
