"""Reading sweep dirs: damaged runs, a missing manifest, controls recognised by manifest, config or name.
"""
import json
import shutil

import numpy as np
import pytest
import yaml

from grpo_ablate.report.build import build_report
from grpo_ablate.report.render import render_markdown
from report_fixtures import CONTROLS, LOO, LOO_CONTRASTS, make_sweep


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
    trains another experiment (seen in issue 31: 11 of 35 runs of a sweep got another eval set).
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
