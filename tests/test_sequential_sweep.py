"""`sweep --seeds auto` (grpo_ablate/sweep/sequential.py): the look loop decided from a sweep
dir — on synthetic run dirs for hundreds of sequences, then on tiny real sweeps that stop,
are killed mid-look and resumed, and are continued with a larger --max-seeds."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, cli
from grpo_ablate.stats import group_sequential as seq
from grpo_ablate.sweep import sequential as sweep_seq
from grpo_ablate.sweep.matrix import SweepError
from grpo_ablate.sweep.plan import SweepRequest
from grpo_ablate.sweep.sequential_console import decision_text

sys.path.insert(0, str(REPO / "benchmarks"))
import sequential_sim  # noqa: E402  (the harness that also writes docs/sequential.md)


def override(base, *extra):
    keys = {e.split("=", 1)[0] for e in extra}
    return [o for o in base if o.split("=", 1)[0] not in keys] + list(extra)


def pure_decision(values: dict, plan: seq.Plan) -> seq.Decision:
    """The rule on the same values, look by look, with no sweep dir in between."""
    d = np.array(values["add-x"]) - np.array(values["base"])
    looks = [seq.Look(n, plan.max_seeds, float(d[:n].mean()), float(d[:n].std(ddof=1)))
             for n in range(plan.initial_seeds, len(d) + 1)]
    return seq.decide(looks, plan)


# ----------------------------------------------------------------------------- synthetic sweep dirs
def synthetic_sweeps(counts):
    """Sequential sweeps on synthetic run dirs (manifest.json, status.json, metrics.jsonl), looked
    at by the sweep's own functions; each decision must be the pure rule's on the same values.
    counts: (null sweeps, sweeps with a true Δ of 1.5 seed SDs). Returns effect -> decisions."""
    plan = seq.Plan()
    root = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        results = {}
        for effect, count, seed in ((0.0, counts[0], 21), (1.5, counts[1], 22)):
            rng = np.random.default_rng(seed)
            results[effect] = []
            for i in range(count):
                decision, values = sequential_sim.one_sweep_dir(root / f"{effect}-{i}", plan, effect, rng)
                pure = pure_decision(values, plan)
                assert (decision["outcome"], decision["n"]) == (
                    {"positive": "helps", "negative": "hurts"}.get(pure.outcome, "undecided"), pure.n)
                assert decision["t"] == pytest.approx(pure.t, rel=1e-9)
                results[effect].append(decision)
        manifest = json.loads((root / "1.5-0" / "manifest.json").read_text())
        looks = manifest["sequential"]["looks"]
        assert [look["look"] for look in looks] == list(range(1, len(looks) + 1))
        assert all(look["decisions"] for look in looks)
        return results
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.full
def test_synthetic_sweep_dirs_decide_as_the_rule():
    """60 sweeps: the sweep applies the pure rule (whose error rate the 20,000-sequence test of
    the rule pins); a true Δ of 1.5 seed SDs is decided in most, some before the last look."""
    results = synthetic_sweeps((40, 20))
    helped = [d for d in results[1.5] if d["outcome"] == "helps"]
    assert len(helped) > 0.5 * len(results[1.5])
    assert any(d["n"] < seq.Plan().max_seeds for d in helped)          # stopped early: all decided


@pytest.mark.slow
def test_synthetic_sweep_dirs_keep_the_error_rate():
    """300 sweeps: null contrasts are called helps/hurts at most 5% (within Monte-Carlo error)."""
    results = synthetic_sweeps((200, 100))
    null = [d["outcome"] for d in results[0.0]]
    wrong = sum(o in ("helps", "hurts") for o in null) / len(null)
    assert wrong <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / len(null))
    assert sum(d["outcome"] == "helps" for d in results[1.5]) > 0.5 * len(results[1.5])


# ----------------------------------------------------------------------------- the loop's pieces
def control_manifest(tmp_path: Path) -> dict:
    """A leave-one-out sweep with one trick and a base control, at look 1, its runs on disk."""
    manifest = sequential_sim.synthetic_manifest(seq.Plan(max_seeds=5))
    manifest["variants"].append({"name": "control-base", "tricks_on": [], "overrides": ["control=base"],
                                 "reference": None, "kind": "control"})
    manifest["controls"] = {"base": "control-base"}
    manifest["runs"] += [{"variant": "control-base", "seed": s, "run_dir": f"control-base-s{s}",
                          "status": "pending"} for s in range(3)]
    manifest["sequential"]["looks"][0]["runs"] = [r["run_dir"] for r in manifest["runs"]]
    return manifest


def write_values(tmp_path, manifest, values: dict):
    for entry in manifest["runs"]:
        if not (tmp_path / entry["run_dir"]).exists():
            sequential_sim.write_run(tmp_path, entry, values[entry["variant"]][entry["seed"]])


def _listed(job) -> dict:
    return {"variant": job.variant, "seed": job.seed, "run_dir": job.run_dir, "status": "pending",
            "overrides": list(job.overrides)}


def test_controls_take_seeds_only_while_a_beats_contrast_is_open(tmp_path):
    manifest = control_manifest(tmp_path)
    contrasts = sweep_seq.contrasts_of(manifest)
    assert [(c["name"], c["kind"]) for c in contrasts] == [
        ("x", "trick"), ("base vs control-base", "control"), ("add-x vs control-base", "control")]
    # the control is as good as the variants, noisily: every contrast stays open
    values = {"base": [0.50, 0.52, 0.47, 0.51], "add-x": [0.51, 0.50, 0.49, 0.52],
              "control-base": [0.49, 0.53, 0.48, 0.50]}
    write_values(tmp_path, manifest, values)
    sweep_seq.record_decisions(manifest, sweep_seq.decide_look(tmp_path, manifest))
    assert {d["outcome"] for d in manifest["sequential"]["looks"][-1]["decisions"]} == {"undecided"}
    assert sweep_seq.needed_variants(manifest) == ["base", "add-x", "control-base"]
    entries = sweep_seq.add_look(manifest, make_entry=_listed)
    assert [e["run_dir"] for e in entries] == ["base-s3", "add-x-s3", "control-base-s3"]
    assert all(f"run.group={manifest['wandb_group']}" in e["overrides"] for e in entries)   # same W&B group
    assert "control=base" in entries[2]["overrides"] and manifest["sequential"]["looks"][-1]["seed"] == 3


def test_a_control_far_below_is_beaten_and_then_takes_no_more_seeds(tmp_path):
    manifest = control_manifest(tmp_path)
    values = {"base": [0.50, 0.52, 0.47], "add-x": [0.51, 0.50, 0.49], "control-base": [0.02, 0.03, 0.015]}
    write_values(tmp_path, manifest, values)
    sweep_seq.record_decisions(manifest, sweep_seq.decide_look(tmp_path, manifest))
    outcomes = {d["name"]: d for d in manifest["sequential"]["looks"][-1]["decisions"]}
    bound = outcomes["base vs control-base"]["boundary"]
    assert outcomes["base vs control-base"]["t"] >= bound and outcomes["base vs control-base"]["outcome"] == "beats"
    assert outcomes["add-x vs control-base"]["outcome"] == "beats" and outcomes["x"]["outcome"] == "undecided"
    assert outcomes["x"]["detectable_effect"] > abs(outcomes["x"]["mean"]) and outcomes["x"]["seeds_needed"] > 3
    assert sweep_seq.needed_variants(manifest) == ["base", "add-x"]      # the control is done
    assert "x: undecided after 3 seeds" in decision_text(outcomes["x"])
    assert "beats at look 1 (3 seeds" in decision_text(outcomes["base vs control-base"])


def test_a_decided_contrast_keeps_its_decision_and_breaking_training_decides(tmp_path):
    manifest = sequential_sim.synthetic_manifest(seq.Plan())
    for entry in manifest["runs"]:
        run_dir = tmp_path / entry["run_dir"]
        run_dir.mkdir()
        state = "diverged" if entry["variant"] == "add-x" else "completed"   # 3 of 3 vs 0 of 3: p 0.016
        (run_dir / "status.json").write_text(json.dumps({"state": state, "step": 1}))
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "eval/accuracy": 0.5}) + "\n")
    sweep_seq.record_decisions(manifest, sweep_seq.decide_look(tmp_path, manifest))
    [decision] = manifest["sequential"]["looks"][-1]["decisions"]
    assert decision["outcome"] == "breaks training" and "3 of 3 with it, 0 of 3 without" in decision["why"]
    assert sweep_seq.stopping_reason(manifest, len(sweep_seq.needed_variants(manifest))) == "all decided"
    manifest["sequential"]["looks"].append({**manifest["sequential"]["looks"][0], "look": 2, "decisions": None})
    assert sweep_seq.decide_look(tmp_path, manifest)[0]["decided_at_look"] == 1      # kept, not re-tested


def test_a_trick_that_changed_nothing_is_decided_inert_at_its_first_look(tmp_path):
    """Identical sides at every seed: more seeds cannot decide it, so it takes none."""
    manifest = sequential_sim.synthetic_manifest(seq.Plan())
    for entry in manifest["runs"]:
        run_dir = tmp_path / entry["run_dir"]
        run_dir.mkdir()
        (run_dir / "status.json").write_text(json.dumps({"state": "completed", "step": 2}))
        rows = [{"step": 1, "loss": 0.1 * entry["seed"]}, {"step": 2, "eval/accuracy": 0.5 + 0.01 * entry["seed"]}]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sweep_seq.record_decisions(manifest, sweep_seq.decide_look(tmp_path, manifest))
    [decision] = manifest["sequential"]["looks"][-1]["decisions"]
    assert decision["outcome"] == "inert here" and "identical metrics at every shared seed" in decision["why"]
    assert sweep_seq.stopping_reason(manifest, len(sweep_seq.needed_variants(manifest))) == "all decided"


def test_budget_stops_before_a_look_that_would_overrun(tmp_path):
    manifest = sequential_sim.synthetic_manifest(seq.Plan())
    section = manifest["sequential"]
    section["looks"][0].update(decisions=[{"outcome": "undecided"}], wall_s=60.0)   # 6 runs in 60 s
    section.update(elapsed_s=60.0, budget_s=85.0)
    assert sweep_seq.stopping_reason(manifest, next_runs=2) is None                  # 60 + 2 x 10 <= 85
    assert sweep_seq.stopping_reason(manifest, next_runs=3) == "budget"
    assert sweep_seq.stopping_reason(manifest, next_runs=0) == "max seeds"


@pytest.mark.parametrize("text, seconds", [("90m", 5400), ("2h", 7200), ("1h30m", 5400), ("45s", 45),
                                           ("600", 600), ("1.5h", 5400)])
def test_budget_durations(text, seconds):
    assert sweep_seq.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "10x", "0", "m"])
def test_bad_budget_durations(text):
    with pytest.raises(SweepError, match="--budget"):
        sweep_seq.parse_duration(text)


# ----------------------------------------------------------------------------- the CLI's checks
@pytest.mark.parametrize("args, message", [
    (["sweep", "add-one-in", "--tricks", "batch_norm", "--max-seeds", "5"], "belong to --seeds auto"),
    (["sweep", "add-one-in", "--tricks", "batch_norm", "--seeds", "auto", "--max-seeds", "2"], "below the 3 initial"),
    (["sweep", "add-one-in", "--tricks", "batch_norm", "--seeds", "auto", "--budget", "soon"], "not a duration"),
    (["sweep", "add-one-in", "--tricks", "batch_norm", "--seeds", "auto", "--effect", "-1"],
     "--effect -1.0 is not allowed"),
    (["sweep", "factorial", "--family", "adv=grpo,dr_grpo", "--seeds", "auto"], "has none"),
    (["sweep", "add-one-in", "--tricks", "batch_norm", "--no-controls", "--seeds", "auto", "--max-seeds", "70"],
     "2 variants x 70 seeds = 140 runs, above the limit of 128"),
    (["doctor", "--seeds", "auto"], "no contrast for --seeds auto"),
    (["sweep", "add-one-in", "--tricks", "batch_norm", "--summary", "nope"], "summary 'nope' is not allowed"),
    (["sweep", "add-one-in", "--tricks", "batch_norm", "--seeds", "auto", "--summary", "mean"],
     "--summary: summary 'mean' is not allowed; allowed: final, auc, best, last_k"),
])
def test_bad_sequential_input_is_one_line_and_leaves_nothing(args, message, tmp_path, cache_dir):
    from test_sweep import cli_here

    r = cli_here(*args, cwd=tmp_path)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_fixed_sweep_is_not_continued_with_max_seeds(tmp_path, cache_dir):
    from test_sweep import cli_here

    sweep_dir = tmp_path / "pairwise"
    shutil.copytree(REPO / "tests" / "golden" / "sweeps" / "pairwise", sweep_dir)
    before = (sweep_dir / "manifest.json").read_bytes()
    r = cli_here("sweep", "--resume", str(sweep_dir), "--max-seeds", "5", cwd=tmp_path)
    assert r.exit_code == 2 and "ran a fixed set of seeds" in r.stderr
    assert (sweep_dir / "manifest.json").read_bytes() == before


def test_dry_run_plans_the_first_look_the_maximum_and_the_time(tmp_path, cache_dir):
    from test_sweep import cli_here

    args = ["sweep", "add-one-in", "--tricks", "batch_norm", "--seeds", "auto", "--max-seeds", "6",
            "--no-controls", "--dir", str(tmp_path / "sweeps" / "new"), "--launcher", "basic"]
    r = cli_here(*args, "--dry-run", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert "look 1 = 2 variants x 3 seeds = 6 runs" in r.stdout and "at most 4 looks and 12 runs" in r.stdout
    assert "expected wall time: unknown" in r.stdout and not (tmp_path / "sweeps").exists()
    shutil.copytree(REPO / "tests" / "golden" / "sweeps" / "pairwise", tmp_path / "sweeps" / "earlier")
    r = cli_here(*args, "--dry-run", cwd=tmp_path)
    walls = [json.loads((d / "status.json").read_text())["wall_time_s"]
             for d in (tmp_path / "sweeps" / "earlier").iterdir() if (d / "status.json").exists()]
    per_run = float(np.median(walls))
    assert f"expected wall time ({per_run:.0f} s a run, the median of {len(walls)} runs of" in r.stdout
    assert f"look 1 ~{6 * per_run:.0f} s, at most ~{12 * per_run:.0f} s" in r.stdout


def test_a_sequential_sweep_looks_at_the_summary_it_was_given(tmp_path, cache_dir):
    from test_sweep import cli_here

    args = ["sweep", "add-one-in", "--tricks", "batch_norm", "--seeds", "auto", "--summary", "auc",
            "--no-controls", "--dir", str(tmp_path / "s"), "--launcher", "basic"]
    r = cli_here(*args, "--dry-run", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert "decided on the auc of eval/accuracy" in r.stdout and not (tmp_path / "s").exists()
    req = SweepRequest(mode="add-one-in", tricks=["batch_norm"], seeds="auto", controls=False)
    manifest = sweep_seq.plan(req, sweep_seq.options_from({"summary": "last_4"}))
    assert manifest["sequential"]["summary"] == "last_4"
    assert sweep_seq.plan(req, sweep_seq.options_from({}))["sequential"]["summary"] == "last_3"


# ----------------------------------------------------------------------------- tiny real sweeps
SLOW = 1200   # seconds: the first real sweep of a session warms the small model up (slow on a busy machine)
def run_files(run_dir: Path) -> dict:
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def manifest_of(sweep_dir: Path) -> dict:
    return json.loads((sweep_dir / "manifest.json").read_text())


@pytest.mark.slow
def test_a_sequential_sweep_stops_and_a_larger_max_seeds_continues_it(tmp_path, small):
    sweep_dir = tmp_path / "sweep"
    r = cli("sweep", "add-one-in", "--tricks", "batch_norm", "--seeds", "auto", "--max-seeds", "4",
            "--launcher", "basic", "--no-controls", "--dir", str(sweep_dir), *override(small, "steps=2"),
            cwd=tmp_path, timeout=SLOW)
    assert r.returncode == 0, r.stdout + r.stderr
    m = manifest_of(sweep_dir)
    section = m["sequential"]
    assert section["stopped"]["reason"] in ("max seeds", "all decided")
    assert [look["seed"] for look in section["looks"]][0] is None
    seeds = section["looks"][-1]["seeds"]
    if section["stopped"]["reason"] == "max seeds":
        assert seeds == {"base": [0, 1, 2, 3], "add-batch_norm": [0, 1, 2, 3]} and len(section["looks"]) == 2
    assert sorted(r["run_dir"] for r in m["runs"]) == sorted({r["run_dir"] for r in m["runs"]})
    assert all(r["status"] == "completed" for r in m["runs"])
    later = [d for look in section["looks"][1:] for d in look["runs"]]
    for run_dir in later:                                 # later looks join the sweep's W&B group
        assert f"run.group={m['wandb_group']}" in (sweep_dir / run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "sequential sweep add-one-in: stopped" in r.stdout
    if section["stopped"]["reason"] != "max seeds":
        return
    finished = {d.name: run_files(d) for d in sweep_dir.iterdir() if d.is_dir() and d.name.endswith(tuple("0123"))}
    r = cli("sweep", "--resume", str(sweep_dir), "--max-seeds", "5", cwd=tmp_path, timeout=SLOW)
    assert r.returncode == 0, r.stdout + r.stderr
    m = manifest_of(sweep_dir)
    section = m["sequential"]
    assert section["max_seeds"] == 5 and len(section["looks"]) == 3 and section["looks"][-1]["seed"] == 4
    assert sorted(x["run_dir"] for x in m["runs"]) == sorted(
        f"{v}-s{s}" for v in ("base", "add-batch_norm") for s in range(5))
    assert finished == {name: run_files(sweep_dir / name) for name in finished}
    [decision] = section["looks"][-1]["decisions"]
    assert decision["n"] == 5 and decision["replanned"] is (decision["outcome"] == "undecided")


@pytest.mark.slow
def test_a_sequential_sweep_killed_in_a_later_look_resumes_it(tmp_path, small):
    """SIGKILL while look 2's first run is training; --resume: that look finishes, every
    finished run is byte-identical, each run is in the manifest once, the sweep goes on."""
    sweep_dir = tmp_path / "sweep"
    args = ["sweep", "add-one-in", "--tricks", "batch_norm", "--seeds", "auto", "--max-seeds", "5",
            "--launcher", "basic", "--no-controls", "--dir", str(sweep_dir),
            *override(small, "steps=8", "checkpoint_every=2", "eval.every=4")]
    proc = subprocess.Popen([sys.executable, "-m", "grpo_ablate.cli", *args], cwd=tmp_path, env=dict(os.environ),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, victim = time.time() + SLOW, None
    while time.time() < deadline and victim is None and proc.poll() is None:
        time.sleep(0.2)
        try:
            looks = manifest_of(sweep_dir)["sequential"]["looks"]
            status = json.loads((sweep_dir / looks[1]["runs"][0] / "status.json").read_text())
        except (OSError, IndexError, KeyError, json.JSONDecodeError):
            continue
        if status["state"] == "running" and status["step"] >= 4:
            victim = looks[1]["runs"][0]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert victim is not None, "the sweep never reached a checkpointed run in look 2"
    finished = {d.name: run_files(d) for d in sweep_dir.iterdir() if d.is_dir() and d.name[-1] in "012"}
    assert len(finished) == 6
    r = cli("sweep", "--resume", str(sweep_dir), cwd=tmp_path, timeout=SLOW)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resuming" in r.stdout and "of 8 runs finished" in r.stdout
    assert finished == {name: run_files(sweep_dir / name) for name in finished}
    m = manifest_of(sweep_dir)
    dirs = [x["run_dir"] for x in m["runs"]]
    assert len(dirs) == len(set(dirs)) and all(x["status"] == "completed" for x in m["runs"])
    looks = m["sequential"]["looks"]
    assert looks[1]["seed"] == 3 and looks[1]["decisions"] and m["sequential"]["stopped"]
    assert [look["look"] for look in looks] == list(range(1, len(looks) + 1))
    steps = [row["step"] for row in map(json.loads, (sweep_dir / victim / "metrics.jsonl").read_text().splitlines())]
    assert steps == list(range(9))                     # resumed from its checkpoint, no step twice
