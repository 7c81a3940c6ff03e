"""One sweep, two starting points: each run records the digest of the weights it started from (LoRA's
base included), and the report and `sweep --resume` name the runs that started from other weights
than the sweep's other runs of their model, never averaging them (rundir/starts.py)."""
import json

import numpy as np
import pytest

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
