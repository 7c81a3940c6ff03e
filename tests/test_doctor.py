"""`grpo-ablate doctor`: the search over synthetic outcomes (pure), its planning checks
in-process, and real small doctor runs end to end (one breaking, one healthy)."""
import itertools
import json

import pytest

from conftest import cli
from grpo_ablate.sweep import doctor as doc
from grpo_ablate.sweep.doctor import SetResult, analyse, verdicts
from test_sweep import cli_here


def simulate(tricks, breaks):
    """Run the search to its end against a ground truth: a set breaks training when it holds
    any of the `breaks` sets. Returns (stages as lists of set names, final analysis, outcomes)."""
    outcomes, stages = {}, []
    while True:
        analysis = analyse(tricks, outcomes)
        if analysis.next is None:
            return stages, analysis, outcomes
        stages.append((analysis.next.kind, sorted(doc.set_name(s, tricks) for s in analysis.next.sets)))
        for s in analysis.next.sets:
            assert s not in outcomes, "a set is never run twice"
            outcomes[s] = SetResult(any(frozenset(b) <= s for b in breaks))


def by_trick(tricks, outcomes, analysis):
    return {v["trick"]: v["verdict"] for v in verdicts(tricks, outcomes, analysis)}


def test_healthy_all_on_means_every_trick_is_safe_after_one_run():
    stages, analysis, outcomes = simulate(["a", "b", "c"], breaks=[])
    assert stages == [("all-on", ["all"])]
    assert by_trick(["a", "b", "c"], outcomes, analysis) == {"a": "safe", "b": "safe", "c": "safe"}


def test_one_trick_that_breaks_alone():
    tricks = ["a", "b", "c", "d"]
    stages, analysis, outcomes = simulate(tricks, breaks=[{"c"}])
    assert stages == [("all-on", ["all"]), ("leave-one-out", ["drop-a", "drop-b", "drop-c", "drop-d"]),
                      ("size-1", ["c"])]
    assert analysis.necessary == {"c"} and analysis.minimal == [frozenset({"c"})]
    assert by_trick(tricks, outcomes, analysis) == {"a": "safe", "b": "safe", "c": "breaks training alone",
                                                   "d": "safe"}


def test_a_pair_that_only_breaks_together_is_found_as_a_pair():
    tricks = ["a", "b", "c", "d"]
    stages, analysis, outcomes = simulate(tricks, breaks=[{"b", "d"}])
    # dropping b or d heals the run, so both are needed: the pair is tried next, and breaks
    assert stages[-1] == ("size-2", ["b+d"]) and len(stages) == 3
    assert analysis.minimal == [frozenset({"b", "d"})]
    result = verdicts(tricks, outcomes, analysis)
    v = {x["trick"]: x for x in result}
    assert v["b"]["verdict"] == "breaks training together with d" and v["b"]["with"] == [["d"]]
    assert v["d"]["verdict"] == "breaks training together with b"
    assert v["a"]["verdict"] == v["c"]["verdict"] == "safe"
    # the evidence: the pair broke, and without b the rest stayed healthy (drop-b)
    assert [(e["set"], e["broken"]) for e in v["b"]["evidence"]] == [("b+d", True), ("drop-b", False)]


def test_two_independent_culprits_need_the_subset_search():
    """No single removal heals the run (a and c each break it alone): singles are searched,
    after checking the bare base."""
    tricks = ["a", "b", "c"]
    stages, analysis, outcomes = simulate(tricks, breaks=[{"a"}, {"c"}])
    assert stages == [("all-on", ["all"]), ("leave-one-out", ["drop-a", "drop-b", "drop-c"]),
                      ("base", ["base"]), ("size-1", ["a", "b", "c"])]
    assert by_trick(tricks, outcomes, analysis) == {"a": "breaks training alone", "b": "safe",
                                                   "c": "breaks training alone"}


def test_two_pairs_pairs_come_after_singles_and_supersets_are_pruned():
    tricks = ["a", "b", "c", "d"]
    stages, analysis, outcomes = simulate(tricks, breaks=[{"a", "b"}, {"c", "d"}])
    assert [kind for kind, _ in stages] == ["all-on", "leave-one-out", "base", "size-1", "size-2"]
    assert analysis.minimal == [frozenset({"a", "b"}), frozenset({"c", "d"})]
    assert by_trick(tricks, outcomes, analysis) == {
        "a": "breaks training together with b", "b": "breaks training together with a",
        "c": "breaks training together with d", "d": "breaks training together with c"}


def test_a_culprit_alone_and_another_pair():
    tricks = ["a", "b", "c"]
    stages, analysis, outcomes = simulate(tricks, breaks=[{"a"}, {"b", "c"}])
    # {a} explains every broken set but drop-a = {b, c}: the search goes on to size 2
    assert stages[-1][0] == "size-1" and analysis.minimal == [frozenset({"a"}), frozenset({"b", "c"})]
    assert by_trick(tricks, outcomes, analysis) == {"a": "breaks training alone",
                                                   "b": "breaks training together with c",
                                                   "c": "breaks training together with b"}


def test_a_triple_and_a_broken_base():
    tricks = ["a", "b", "c", "d"]
    _, analysis, outcomes = simulate(tricks, breaks=[{"a", "b", "c"}])
    assert analysis.minimal == [frozenset({"a", "b", "c"})]
    assert by_trick(tricks, outcomes, analysis)["d"] == "safe"
    _, analysis, outcomes = simulate(["a", "b"], breaks=[set()])
    assert by_trick(["a", "b"], outcomes, analysis) == {"a": "not to blame", "b": "not to blame"}


@pytest.mark.parametrize("n", [2, 3, 4])
def test_the_search_always_finds_the_true_minimal_sets(n):
    """Every ground truth of up to two breaking sets over n tricks: the minimal sets found are
    exactly the true ones, and no set is run twice."""
    tricks = "abcd"[:n]
    subsets = [frozenset(c) for k in range(1, n + 1) for c in itertools.combinations(tricks, k)]
    for truth in itertools.chain(([s] for s in subsets), itertools.combinations(subsets, 2)):
        true_minimal = {s for s in truth if not any(o < s for o in truth)}
        _, analysis, _ = simulate(list(tricks), breaks=truth)
        assert set(analysis.minimal) == true_minimal, (truth, analysis.minimal)


def test_undetermined_when_the_budget_stops_the_search():
    tricks = ["a", "b", "c"]
    outcomes = {frozenset(tricks): SetResult(True)}
    analysis = analyse(tricks, outcomes)                       # asks for leave-one-out; not run
    assert analysis.next.kind == "leave-one-out"
    assert set(by_trick(tricks, outcomes, analysis).values()) == {"undetermined"}


# ------------------------------------------------------------------------------ the CLI
@pytest.mark.parametrize("args, message", [
    (["--tricks", "nope"], "unknown trick nope"),
    (["--tricks", "token_mean,dr_grpo_norm"], "both set family 'loss_agg'"),
    (["--tricks", "clip_higher", "--base", "dapo"], "already on in the base"),
    (["--tricks", "clip_higher", "--seeds", "0"], "--seeds '0' is not allowed"),
    (["--tricks", "clip_higher", "adv=nope"], "adv=nope is not an option"),
    (["--tricks", "clip_higher", "--threshold", "bogus=1"], "--threshold 'bogus=1'"),
    (["--tricks", "clip_higher", "--max-runs", "1", "--seeds", "2"], "leaves no room"),
    (["--tricks", "clip_higher", "--launcher", "nope"], "--launcher nope is not allowed"),
    (["--resume", "nowhere"], "not a doctor dir"),
    (["--resume", "nowhere", "--tricks", "a"], "drop --tricks"),
])
def test_bad_input_is_one_line_and_leaves_nothing(args, message, tmp_path, cache_dir):
    r = cli_here("doctor", *args, cwd=tmp_path)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_dry_run_prints_the_first_stages(tmp_path, cache_dir):
    r = cli_here("doctor", "--dry-run", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert "all" in r.stdout and "drop-learnable_temperature" in r.stdout and "preset=grpo" in r.stdout
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ real runs
# learnable_temperature given a destructive setting: a learning rate so high that T jumps to
# its lower bound at the first update, and sampling collapses (entropy_collapse at step 2).
# The `++` keys go to the runs that have the trick on (plan.scope_trick_settings).
BREAK_TEMPERATURE = ["++temperature.lr=100", "++temperature.t_min=0.01", "++temperature.t_max=1.0"]


@pytest.mark.slow
def test_doctor_names_the_trick_that_breaks_training(tmp_path, small):
    out = tmp_path / "doc"
    r = cli("doctor", "--tricks", "batch_norm,learnable_temperature", "--steps", "5", "--launcher", "basic",
            "--dir", str(out), *small, *BREAK_TEMPERATURE, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr             # something breaks training
    result = json.loads((out / "doctor.json").read_text())
    v = {x["trick"]: x for x in result["verdicts"]}
    assert v["learnable_temperature"]["verdict"] == "breaks training alone"
    assert v["batch_norm"]["verdict"] == "safe"
    assert [s["dir"] for s in result["stages"]] == ["1-all-on", "2-leave-one-out"]
    # each verdict is backed by runs in its stage's sweep dir, flags and steps included
    [alone] = v["learnable_temperature"]["evidence"]
    assert alone["set"] == "learnable_temperature" and alone["broken"]
    [run] = alone["runs"]
    assert run["run"] == "2-leave-one-out/learnable_temperature-s0"
    assert run["flags"][0]["name"] == "entropy_collapse" and run["flags"][0]["step"] == 2
    status = json.loads((out / "2-leave-one-out" / "learnable_temperature-s0" / "status.json").read_text())
    assert status["state"] == "completed"
    manifest = json.loads((out / "2-leave-one-out" / "manifest.json").read_text())
    assert manifest["mode"] == "doctor" and manifest["wandb_group"] == result["request"]["group"]
    healthy = next(e for e in v["batch_norm"]["evidence"] if not e["broken"])
    assert healthy["runs"][0]["run"] == "2-leave-one-out/batch_norm-s0" and healthy["runs"][0]["flags"] == []
    md = (out / "doctor.md").read_text()
    assert "| learnable_temperature | breaks training alone |" in md and "entropy_collapse@2" in md
    assert "learnable_temperature" in r.stdout and "breaks training alone" in r.stdout
    # resuming a finished doctor dir runs nothing and says the same
    again = cli_here("doctor", "--resume", str(out), cwd=tmp_path)
    assert again.exit_code == 1 and json.loads((out / "doctor.json").read_text())["verdicts"] == result["verdicts"]
    assert "launching" not in again.stdout and "breaks training alone" in again.stdout


def test_doctor_on_a_healthy_set_says_every_trick_is_safe(tmp_path, small):
    out = tmp_path / "doc"
    r = cli("doctor", "--tricks", "batch_norm,token_mean", "--steps", "4", "--launcher", "basic",
            "--dir", str(out), *small, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads((out / "doctor.json").read_text())
    assert [x["verdict"] for x in result["verdicts"]] == ["safe", "safe"]
    assert [s["dir"] for s in result["stages"]] == ["1-all-on"] and result["runs"] == 1
    assert result["verdicts"][0]["evidence"][0]["runs"][0]["run"] == "1-all-on/all-s0"
    assert "every trick is safe" in (out / "doctor.md").read_text()
