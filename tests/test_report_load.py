"""Reading sweep dirs: damaged runs, a missing manifest, controls recognised by manifest, config or name.
"""
import json
import shutil

import numpy as np
import pytest
import yaml

import report_sim
from conftest import cli_here
from grpo_ablate.report.build import build_report
from grpo_ablate.report.render import render_markdown
from report_fixtures import CONTROLS, LOO, LOO_CONTRASTS, SWEEP_ID, make_sweep, metric_rows, write_run
from test_faults import refused, snapshot


def test_controls_recognised_without_manifest(tmp_path):
    # add-one-in: the base and control-base both have no tricks; the control must not pose as
    # the base in the contrast of x (dirs are read in name order: control-base comes after base)
    variants = {"base": {"tricks": [], "reference": None, "final": {0: 0.60, 1: 0.64, 2: 0.62}},
                "+x": {"tricks": ["x"], "reference": "base", "final": {0: 0.75, 1: 0.80, 2: 0.78}}}
    sweep = make_sweep(tmp_path / "s", variants, mode="add-one-in", manifest=False, controls=CONTROLS)
    report = build_report(sweep)
    rows = {r["variant"]: r for r in report.rows}
    assert [r["variant"] for r in report.rows] == ["+x", "base", "control-base", "control-sft"]
    assert report.controls == {"base": "control-base", "sft": "control-sft"}
    assert [(v["trick"], v["with"], v["without"]) for v in report.verdicts] == [("x", "+x", "base")]
    assert rows["+x"]["reference"] == "base" and rows["control-base"]["reference"] is None
    assert rows["+x"]["delta_vs_base"].mean == pytest.approx(np.mean([0.75, 0.80, 0.78]) - 0.5)

    # by name alone (config.yaml without a control node, as an older trainer writes it)
    for config in sweep.glob("*/config.yaml"):
        data = yaml.safe_load(config.read_text())
        data.pop("control", None)
        config.write_text(yaml.safe_dump(data))
    report = build_report(sweep)
    assert report.controls == {"base": "control-base", "sft": "control-sft"}
    assert [(v["trick"], v["with"], v["without"]) for v in report.verdicts] == [("x", "+x", "base")]

    # by config.yaml alone: control.name says sft, whatever the variant is called
    for config in sweep.glob("control-sft-s*/config.yaml"):
        data = yaml.safe_load(config.read_text())
        data["control"] = {"name": "sft", "budget": "wall"}
        data["sweep"]["variant"] = "supervised"
        config.write_text(yaml.safe_dump(data))
    report = build_report(sweep)
    assert report.controls == {"base": "control-base", "sft": "supervised"}
    assert {r["variant"]: r for r in report.rows}["supervised"]["budget"] == "wall"


def test_malformed_controls_in_manifest_are_notes(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS, controls={"base": CONTROLS["base"]})
    manifest = json.loads((sweep / "manifest.json").read_text())
    manifest["controls"] = {"base": "control-base", "sft": "control-nope"}
    manifest["contrasts"].append({"trick": "q", "with": "all", "without": "control-base"})
    (sweep / "manifest.json").write_text(json.dumps(manifest))
    report = build_report(sweep)
    text = render_markdown(report)
    assert "names 'control-nope' as the sft control, but the sweep has no such variant" in text
    assert "contrasts with a control left out of the trick verdicts: q (all vs control-base)" in text
    assert "Δ vs base" in text and "Δ vs SFT control" not in text
    manifest["controls"] = ["control-base"]
    (sweep / "manifest.json").write_text(json.dumps(manifest))
    report = build_report(sweep)   # still a control by its kind
    assert report.controls == {"base": "control-base"}
    assert "`controls` is not an object" in render_markdown(report)



def test_partial_sweep_says_what_is_missing(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    (sweep / "all-s2" / "metrics.jsonl").unlink()                             # no metrics
    with open(sweep / "drop-a-s0" / "metrics.jsonl", "a") as f:               # killed mid-write
        f.write('{"step": 41, "loss": 0.')
    (sweep / "drop-b-s1" / "status.json").unlink()                            # no status
    shutil.rmtree(sweep / "drop-c-s2")                                        # never started
    report = build_report(sweep)
    text = render_markdown(report)
    assert "`all-s2`: no metrics.jsonl; status.json says completed, but there are no metrics" in text
    assert "`drop-a-s0`: metrics.jsonl: torn last line ignored" in text
    assert "`drop-b-s1`: no status.json" in text
    assert "`drop-c-s2`: not started (no run dir)" in text
    rows = {r["variant"]: r for r in report.rows}
    assert rows["all"]["final"].n == 2 and rows["all"]["status"]["missing"] == 1
    assert rows["drop-a"]["final"].mean == pytest.approx(np.mean([0.70, 0.75, 0.71]))   # torn line ignored
    assert "2 completed, 1 missing" in text
    # seeds no longer match: Welch instead of pairing
    assert "dropped" in {v["trick"]: v for v in report.verdicts}["a"]["delta"].basis   # paired on shared seeds
    assert not report.finished


def test_missing_manifest_groups_run_dirs(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, manifest=False)
    report = build_report(sweep)
    assert not report.sweep.manifest_found
    assert {r["variant"] for r in report.rows} == set(LOO)
    rows = {r["variant"]: r for r in report.rows}
    assert rows["drop-a"]["reference"] == "all"                 # leave-one-out: one trick more
    assert {v["trick"]: v["verdict"] for v in report.verdicts} == {"a": "helps", "b": "no evidence", "c": "hurts"}
    assert "manifest.json is missing" in render_markdown(report)
    # plain train runs carry no sweep node: the variant named `all` still says leave-one-out
    for config in sweep.glob("*/config.yaml"):
        data = yaml.safe_load(config.read_text())
        del data["sweep"]
        config.write_text(yaml.safe_dump(data))
    rows = {r["variant"]: r for r in build_report(sweep).rows}
    assert rows["drop-b"]["reference"] == "all" and rows["all"]["reference"] is None




def test_a_run_that_trained_another_config_than_planned_is_left_out_as_failed(tmp_path):
    """A sweep's jobs compose the live conf/ when they start: a run launched after conf/ changed
    trains another experiment (seen on a real sweep: 11 of 35 runs of a sweep got another eval set).
    Its status.json's config hash differs from the manifest's: the report says so and never
    averages it in, and the sweep's own status refresh marks it failed with the way out."""
    from grpo_ablate.sweep.manifest import refresh_statuses

    path = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    status = json.loads((path / "drop-a-s2" / "status.json").read_text())
    (path / "drop-a-s2" / "status.json").write_text(json.dumps({**status, "config_hash": "ffff"}))
    report = build_report(path)
    run = next(r for r in report.sweep.runs if r.name == "drop-a-s2")
    assert run.state == "failed" and "trained another config than the sweep planned" in run.notes[0]
    assert "seed 2" in {v["trick"]: v for v in report.verdicts}["a"]["delta"].basis        # dropped and said
    manifest = json.loads((path / "manifest.json").read_text())
    refresh_statuses(path, manifest)
    entry = next(r for r in manifest["runs"] if r["run_dir"] == "drop-a-s2")
    assert entry["status"] == "failed" and "--rerun drop-a-s2" in entry["reason"]
    assert all(r["status"] == "completed" for r in manifest["runs"] if r["run_dir"] != "drop-a-s2")


# --------------------------------------------------------------------------- damaged and foreign inputs
def _report(path):
    """`grpo-ablate report <path> --no-figures` in this process: (result, report.json, warning lines)."""
    done = cli_here("report", path, "--no-figures", cwd=path.parent)
    assert done.exit_code == 0 and "Traceback" not in done.stdout + done.stderr, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    return done, json.loads((path / "report.json").read_text()), warnings


def _edit_json(path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _set_seed(manifest, value):
    manifest["runs"][0]["seed"] = value


@pytest.mark.parametrize("edit, needle", [
    (lambda m: m.update(seeds=5), "`seeds` is 5, expected a list of int"),
    (lambda m: m["variants"][0].update(tricks_on=5), "variants[0]: `tricks_on` is 5, expected a list of str"),
    (lambda m: m.update(overrides=7), "`overrides` is 7, expected a list of str"),
    (lambda m: _set_seed(m, "abc"), "runs[0]: `seed` is 'abc', expected int"),
    (lambda m: m.update(runs={"all-s0": {}}), "`runs` is {'all-s0': {}}, expected a list of dict"),
    (lambda m: m.update(contrasts=["a"]), "`contrasts` is ['a'], expected a list of dict"),
    (lambda m: m.update(variants=5), "`variants` is 5, expected a list of dict"),
    (lambda m: m["runs"][1].update(run_dir="all-s0"), "runs[0] and runs[1] both name the run dir 'all-s0'"),
])
def test_a_damaged_manifest_is_one_line_and_nothing_written(tmp_path, edit, needle):
    """The manifest says which runs are the sweep's: of the wrong shape, the report cannot be made."""
    path = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    _edit_json(path / "manifest.json", edit)
    before = snapshot(path)
    line = refused(cli_here("report", path, "--no-figures", cwd=tmp_path), needle)
    assert "manifest.json is damaged" in line and "move it aside" in line
    assert snapshot(path) == before


def test_a_manifest_that_is_not_json_is_one_line(tmp_path):
    path = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    (path / "manifest.json").write_text('{"version": 1, "runs": [')
    before = snapshot(path)
    refused(cli_here("report", path, "--no-figures", cwd=tmp_path), "manifest.json is truncated; restore it")
    assert snapshot(path) == before


def _last_eval(run_dir, **row):
    """Replace the last row of evals.jsonl (and the last eval/accuracy, so the two still agree)."""
    rows = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    rows[-1] = {"step": rows[-1]["step"], "set": "sim", **row}
    (run_dir / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _last_accuracy(run_dir, value):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows[-1]["eval/accuracy"] = value
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


DAMAGED_RUN_FILES = {   # what goes wrong in drop-t0-s1 -> the warning's words
    "two sizes of one eval set": (
        lambda d: (_last_eval(d, n=8, bits="ff"), _last_accuracy(d, 1.0)),
        "evals.jsonl is damaged (eval set 'sim' has 16 problems in one eval and 8 at step 30)"),
    "scores not numbers": (lambda d: _last_eval(d, n=1, scores=["abc"]),
                           "evals.jsonl is damaged (step 30: the per-problem scores are not numbers)"),
    "bits that are not hex": (
        lambda d: _last_eval(d, n=16, bits="zzzz"),
        "evals.jsonl is damaged (step 30: the per-problem scores are damaged: `bits` is not hex)"),
    "a NaN score": (lambda d: _last_eval(d, n=16, scores=[float("nan")] + [1.0] * 15),
                    "evals.jsonl is damaged (step 30: a per-problem score is not a number in [0, 1])"),
    "a score of 2": (lambda d: _last_eval(d, n=16, scores=[2.0] + [0.0] * 15),
                     "evals.jsonl is damaged (step 30: a per-problem score is not a number in [0, 1])"),
    "an accuracy of 7.5": (lambda d: _last_accuracy(d, 7.5),
                           "metrics.jsonl is damaged (`eval/accuracy` is 7.5 at step 30, outside [0, 1])"),
    "an accuracy of abc": (lambda d: _last_accuracy(d, "abc"),
                           "metrics.jsonl is damaged (`eval/accuracy` is 'abc' at step 30, not a number)"),
    "a config.yaml that is not YAML": (lambda d: (d / "config.yaml").write_text("seed: [0"),
                                       "config.yaml cannot be read as YAML (ParserError)"),
    "a config.yaml that is a list": (lambda d: (d / "config.yaml").write_text("- seed\n"),
                                     "config.yaml is not a YAML mapping"),
    "a status step of abc": (lambda d: _edit_json(d / "status.json", lambda s: s.update(step="abc")),
                             "status.json is not a run status (a state and a step)"),
    "a status time of abc": (lambda d: _edit_json(d / "status.json", lambda s: s.update(wall_time_s="abc")),
                             "status.json is damaged (`wall_time_s` is 'abc', expected float)"),
}


@pytest.mark.parametrize("damage", DAMAGED_RUN_FILES)
def test_a_damaged_run_file_leaves_that_run_out_with_one_line(tmp_path, damage):
    """The report goes on without the run (never a traceback, never its numbers averaged in), says so
    in one warning line naming the file, and in the run's notes; the eval-noise table shows no nan."""
    edit, words = DAMAGED_RUN_FILES[damage]
    path, _ = report_sim.write_sweep(tmp_path / "s", np.random.default_rng(0), tricks=2, seeds=3, problems=16)
    edit(path / "drop-t0-s1")
    done, report, warnings = _report(path)
    assert warnings == [f"warning: {path / 'drop-t0-s1'}: {words}; the report goes on without this run"]
    row = next(r for r in report["variants"] if r["variant"] == "drop-t0")
    assert row["final"]["n"] == 2 and row["status"] == {"completed": 2, "failed": 1}
    run = next(r for r in report["runs"] if r["run_dir"] == "drop-t0-s1")
    assert run["state"] == "failed" and any(words in n and "left out" in n for n in run["notes"])
    assert "nan" not in (path / "report.md").read_text().lower()


def _cut_mid_line(run_dir):
    text = (run_dir / "evals.jsonl").read_text()
    (run_dir / "evals.jsonl").write_text(text[:len(text) - 10])


@pytest.mark.parametrize("lose, note", [(_cut_mid_line, "evals.jsonl: torn last line ignored"),
                                        (lambda d: (d / "evals.jsonl").write_text(""), None),
                                        (lambda d: (d / "evals.jsonl").unlink(), None)])
def test_per_problem_scores_lost_from_one_run_are_said_and_no_interval_counts_problems(tmp_path, lose, note):
    """A run whose evals.jsonl lost its last eval keeps its numbers (metrics.jsonl has them), but the report
    no longer counts eval problems in any interval, and names the run where it says so."""
    path, _ = report_sim.write_sweep(tmp_path / "s", np.random.default_rng(0), tricks=2, seeds=3, problems=16)
    lose(path / "drop-t0-s1")
    done, report, warnings = _report(path)
    assert report["inference"]["why_seeds_only"] == ("the per-problem scores of drop-t0-s1 are missing, damaged "
                                                          "or not of this metric (evals.jsonl: see the runs' notes)")
    assert "Intervals count seeds only: the per-problem scores of drop-t0-s1" in (path / "report.md").read_text()
    run = next(r for r in report["runs"] if r["run_dir"] == "drop-t0-s1")
    assert run["state"] == "completed" and (note is None or note in run["notes"])


def _copy_in(path, other, name):
    """Another sweep's 3-step run of drop-a seed 0, scoring 0.99, at `path / name` (outside when ../)."""
    run_dir = (path / name).resolve()
    shutil.rmtree(run_dir, ignore_errors=True)
    write_run(run_dir, "drop-a", 0, ["b", "c"], metric_rows(0.99, steps=3))
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["steps"], config["sweep"]["id"] = 3, other
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return run_dir


FOREIGN_RUNS = {   # how another sweep's run got into this sweep -> the note's words
    "an absolute run dir": (lambda p: str(_copy_in(p, "other", "../other/drop-a-s0")),
                            "not this sweep's run (its run dir '{dir}' is not inside the sweep dir"),
    "a ../ run dir": (lambda p: (_copy_in(p, "other", "../other/drop-a-s0"), "../other/drop-a-s0")[1],
                      "not this sweep's run (its run dir '{dir}' is not inside the sweep dir"),
    "copied in under the same seed": (lambda p: _copy_in(p, "other", "drop-a-s0").name,
                                      f"not this sweep's run: its config.yaml is of sweep other, not {SWEEP_ID}"),
    "copied in, only its steps differ": (lambda p: _copy_in(p, SWEEP_ID, "drop-a-s0").name,
                                         "not this sweep's run: its config.yaml trains 3 steps, the sweep 40"),
    "another variant's run copied in": (lambda p: (shutil.rmtree(p / "drop-a-s0"),
                                                   shutil.copytree(p / "drop-b-s0", p / "drop-a-s0"))[1].name,
                                    "not this sweep's run: its config.yaml is of variant drop-b, not drop-a"),
}


@pytest.mark.parametrize("how", FOREIGN_RUNS)
def test_a_run_that_is_not_this_sweeps_is_left_out(tmp_path, how):
    """`steps` is outside the config hash: a 3-step run of another sweep beside 40-step runs was averaged
    in. Another sweep id, other steps than the manifest's, a run dir outside the sweep dir: left out."""
    place, words = FOREIGN_RUNS[how]
    path = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    run_dir = place(path)
    _edit_json(path / "manifest.json", lambda m: m["runs"][3].update(run_dir=run_dir))   # drop-a seed 0
    done, report, warnings = _report(path)
    assert len(warnings) == 1 and words.format(dir=run_dir) in warnings[0], done.stderr
    row = next(r for r in report["variants"] if r["variant"] == "drop-a")
    assert row["final"]["n"] == 2 and row["final"]["mean"] == pytest.approx(np.mean([0.75, 0.71]))


def test_a_contrast_naming_no_variant_is_said(tmp_path):
    """A contrast whose side is no variant of the sweep was silently untested."""
    contrasts = LOO_CONTRASTS + [{"trick": "z", "with": "all", "without": "drop-z"}]
    path = make_sweep(tmp_path / "s", LOO, contrasts=contrasts)
    done, report, warnings = _report(path)
    assert warnings == [f"warning: {path / 'manifest.json'}: contrast z names drop-z, no variant of this sweep; "
                        "the report goes on without it"]
    assert "contrast z (all vs drop-z) names no variant of this sweep (drop-z)" in (path / "report.md").read_text()
    assert [v["trick"] for v in report["verdicts"]] == ["a", "b", "c"]


def test_one_eval_set_name_at_two_sizes_across_runs_is_two_eval_sets(tmp_path):
    """Each run's evals.jsonl is whole, but one run scored 8 problems under the name the others score
    16 under (was a broadcast traceback in the intervals): not paired on problems, said so."""
    path, _ = report_sim.write_sweep(tmp_path / "s", np.random.default_rng(0), tricks=2, seeds=3, problems=16)
    run_dir = path / "drop-t0-s1"
    _last_eval(run_dir, n=8, bits="ff")
    _last_accuracy(run_dir, 1.0)
    last = (run_dir / "evals.jsonl").read_text().splitlines()[-1]
    (run_dir / "evals.jsonl").write_text(last + "\n")
    done, report, warnings = _report(path)
    assert warnings == []
    assert "the runs were scored on different eval sets" in (path / "report.md").read_text()


def test_a_metrics_row_whose_step_is_not_finite_is_skipped(tmp_path):
    """A row with step NaN is no step (was a traceback casting the steps to integers)."""
    path = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    rows = [json.loads(line) for line in (path / "drop-a-s0" / "metrics.jsonl").read_text().splitlines()]
    rows[5]["step"] = float("nan")
    (path / "drop-a-s0" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done, report, warnings = _report(path)
    assert warnings == [] and next(r for r in report["variants"] if r["variant"] == "drop-a")["final"]["n"] == 3


def test_runs_scored_on_eval_sets_of_other_sizes_are_named(tmp_path):
    """One run whose every eval scored 8 problems where the others scored 16: no interval counts problems, and
    the report says which runs had which size."""
    path, _ = report_sim.write_sweep(tmp_path / "s", np.random.default_rng(0), tricks=2, seeds=3, problems=16)
    run_dir = path / "drop-t0-s1"
    rows = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    (run_dir / "evals.jsonl").write_text("".join(json.dumps({"step": r["step"], "set": "sim", "n": 8, "bits": "ff"})
                                                 + "\n" for r in rows))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in metrics:
        if "eval/accuracy" in row:
            row["eval/accuracy"] = 1.0
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    _, report, _ = _report(path)
    why = report["inference"]["why_seeds_only"]
    assert why.startswith("the runs were scored on different eval sets (sim of 16 problems: ") and why.endswith(
        "; sim of 8 problems: drop-t0-s1)")
