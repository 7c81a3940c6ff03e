"""The no-RL controls: ordinary runs that share a GRPO run's metric keys, whose eval numbers
are those of a direct evaluation of their weights."""
import json

import pytest
import torch

from conftest import cli
from grpo_ablate.config.compose import compose
from grpo_ablate.train.distributed import DataParallel
from grpo_ablate.train.entrypoint import run_hydra
from grpo_ablate.sampling.engines import HFEngine, Rollouts
from grpo_ablate.models import load_model_and_tokenizer, stop_token_ids
from grpo_ablate.sampling.prompts import PromptEncoder
from grpo_ablate.tasks import build_task
from grpo_ablate.evals.protocol import GREEDY
from grpo_ablate.evals.score import evaluate


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def direct_eval(path, small):
    """Greedy eval of the weights in `path`, built from scratch here."""
    cfg = compose(small)
    task = build_task(cfg.task)
    model, tokenizer = load_model_and_tokenizer(path, attn_implementation="eager")
    rollouts = Rollouts(HFEngine(model, bool(cfg.rollout.lean_decoder)), tokenizer, PromptEncoder(tokenizer, task),
                        task, DataParallel(), torch.device("cpu"), eos_id=stop_token_ids(model, tokenizer),
                        max_new_tokens=int(cfg.eval.max_new_tokens), seed=0, rng="stream",
                        stream=torch.Generator())
    return evaluate(model, rollouts, task.eval_set(), GREEDY, seed=0, step=0,
                    max_new_tokens=int(cfg.eval.max_new_tokens))


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory, cache_dir):
    """One GRPO run and the two controls, same start, same schedule."""
    from conftest import SMALL

    small = list(SMALL) + [f"model.cache_dir={cache_dir}"]
    root = tmp_path_factory.mktemp("controls")
    for name, extra in (("grpo", []), ("base", ["control=base"]), ("sft", ["control=sft"]),
                        ("start", ["control=base", "control.sample=false"])):
        assert run_hydra([*small, *extra, f"hydra.run.dir={root / name}"]) == 0
    return root, small


def test_controls_write_the_metric_keys_a_grpo_run_has(three_runs):
    root, _ = three_runs
    grpo_keys = set().union(*map(set, rows(root / "grpo")))
    for control in ("base", "sft"):
        control_rows = rows(root / control)
        assert [r["step"] for r in control_rows] == [0, 1, 2, 3, 4]
        keys = set().union(*map(set, control_rows))
        assert keys <= grpo_keys, keys - grpo_keys     # nothing of their own: reports line them up
        assert {"eval/accuracy", "time/step_s", "perf/completion_tokens"} <= keys
        assert json.loads((root / control / "status.json").read_text())["state"] == "completed"
    assert {"reward/mean", "length/mean", "length/truncated_frac"} <= set(rows(root / "base")[1])
    assert {"loss", "optim/grad_norm", "optim/lr"} <= set(rows(root / "sft")[1])


def test_base_control_never_changes_the_policy(three_runs):
    """Its eval is the warm start's, every time; its checkpoint holds the warm start's weights."""
    root, small = three_runs
    evals = [r["eval/accuracy"] for r in rows(root / "base") if "eval/accuracy" in r]
    start = rows(root / "grpo")[0]
    assert evals == [start["eval/accuracy"]] * 3
    start_model = compose(small)
    from grpo_ablate.models import ensure_warm_started

    warm = load_model_and_tokenizer(ensure_warm_started(start_model.model, build_task(start_model.task)))[0]
    kept = load_model_and_tokenizer(root / "base" / "checkpoint")[0]
    for (name, a), b in zip(warm.state_dict().items(), kept.state_dict().values()):
        assert torch.equal(a, b), name


def test_an_eval_only_base_control_logs_the_starts_eval_and_samples_nothing(three_runs):
    """control.sample=false (a sweep's base control): the same eval as the sampling base control
    at every point of the schedule, the start's own, and no sampled or trained tokens."""
    root, small = three_runs
    start, sampled = rows(root / "start"), rows(root / "base")
    assert [r["step"] for r in start] == [0, 1, 2, 3, 4]
    evals = lambda rs: [(r["step"], r["eval/accuracy"], r["eval/length_mean"]) for r in rs if "eval/accuracy" in r]
    assert evals(start) == evals(sampled) and len(evals(start)) == 3
    direct = direct_eval(root / "start" / "checkpoint", small)
    assert start[0]["eval/accuracy"] == pytest.approx(direct["eval/accuracy"], abs=1e-9)
    assert not any(k.startswith(("perf/", "reward/", "length/")) for r in start for k in r)
    assert json.loads((root / "start" / "status.json").read_text())["state"] == "completed"


def test_sft_control_eval_equals_a_direct_eval_of_its_checkpoint(three_runs):
    root, small = three_runs
    final = rows(root / "sft")[-1]
    direct = direct_eval(root / "sft" / "checkpoint", small)
    assert final["step"] == 4
    for key in ("eval/accuracy", "eval/length_mean", "eval/truncated_frac"):
        assert final[key] == pytest.approx(direct[key], abs=1e-9), key
    # and it did train: its weights moved away from the start
    kept = load_model_and_tokenizer(root / "sft" / "checkpoint")[0]
    base = load_model_and_tokenizer(root / "base" / "checkpoint")[0]
    assert any(not torch.equal(a, b) for a, b in zip(kept.parameters(), base.parameters()))


def test_wall_clock_budget(tmp_path, small):
    run_dir = tmp_path / "wall"
    assert run_hydra([*small, "control=sft", "control.budget=wall", "control.wall_s=0.5",
                      f"hydra.run.dir={run_dir}"]) == 0
    data = rows(run_dir)[1:]
    assert sum(r["perf/completion_tokens"] for r in data) > 0 and len(data) == 4


@pytest.mark.parametrize("args, message", [
    (["control=nope"], "control=nope is not an option of config group 'control'; allowed: base, none, rft, sft"),
    (["control=sft", "control.budget=wall"], "control.budget=wall needs control.wall_s"),
    (["control=sft", "control.budget=hours"], "control.budget='hours' is not allowed; allowed: tokens, wall"),
])
def test_bad_control_input_is_one_line(args, message, tmp_path, cache_dir):
    r = cli("train", *args, cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {message}") and len(r.stderr.splitlines()) == 1, r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_sweep_sft_control_on_the_treatments_wall_clock(tmp_path, small):
    """--control-budget wall: the SFT control runs after the treatments, for their median
    training time (eval excluded), and is then an ordinary, hashed, resumable run."""
    import statistics

    from conftest import cli

    sweep_dir = tmp_path / "sweep"
    r = cli("sweep", "add-one-in", "--tricks", "batch_norm", "--seeds", "1", "--launcher", "basic",
            "--control-budget", "wall", "--dir", str(sweep_dir), *small, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    manifest = json.loads((sweep_dir / "manifest.json").read_text())
    by = {run["variant"]: run for run in manifest["runs"]}
    trained = [sum(row.get("time/step_s", 0.0) for row in rows(sweep_dir / by[v]["run_dir"]))
               for v in ("base", "add-batch_norm")]
    wall = [o for o in by["control-sft"]["overrides"] if o.startswith("control.wall_s=")]
    assert wall == [f"control.wall_s={max(statistics.median(trained), 0.1):.1f}"]
    status = json.loads((sweep_dir / "control-sft-s0" / "status.json").read_text())
    assert status["state"] == "completed" and status["config_hash"] == by["control-sft"]["config_hash"]
    assert "deferred" not in by["control-sft"]


def untimed(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/tokens_per_s"))} for r in rows(run_dir)]


def test_rft_trains_on_exactly_the_verified_correct_samples(small, tmp_path, monkeypatch):
    """Every completion the verifier scores 1 is trained on, and nothing else; rft/kept_frac is
    the step's fraction of correct rewards; the weights move; the GRPO run's keys plus rft/*."""
    from grpo_ablate.train.controls import ControlStep

    seen = []   # per update: (the step's sampled batch, the rows trained on)
    sample_groups, nll_update = ControlStep.sample_groups, ControlStep.nll_update
    monkeypatch.setattr(ControlStep, "sample_groups", lambda self, step: seen.append([sample_groups(self, step)])
                        or seen[-1][0])
    monkeypatch.setattr(ControlStep, "nll_update", lambda self, kept: seen[-1].append(kept) or nll_update(self, kept))
    assert run_hydra([*small, "control=rft", f"hydra.run.dir={tmp_path / 'rft'}"]) == 0
    task = build_task(compose(small).task)
    trained = [r for r in rows(tmp_path / "rft")[1:]]
    assert len(seen) == len(trained) == 4
    for (batch, *kept), row in zip(seen, trained):
        correct = batch.scores == 1.0
        assert row["rft/kept_frac"] == correct.float().mean().item() == row["train/accuracy"]
        assert [task.reward(t, batch.problems[i // 4]) for i, t in enumerate(batch.texts)] == batch.scores.tolist()
        assert 0 < correct.sum() < len(correct), "the small model must get some right and some wrong"
        assert torch.equal(kept[0].sequences, batch.roll.sequences[correct])   # exactly the correct rows
        assert row["perf/completion_tokens"] == int(batch.roll.lengths[correct].sum())
        assert row["perf/sampled_tokens"] == int(batch.roll.lengths.sum()) and row["rft/skipped"] == 0
    keys = set().union(*map(set, trained))
    assert {"loss", "optim/grad_norm", "optim/lr", "eval/accuracy", "reward/mean", "length/mean"} <= keys
    start = load_model_and_tokenizer(tmp_path / "rft" / "checkpoint")[0]
    from grpo_ablate.models import ensure_warm_started

    warm = load_model_and_tokenizer(ensure_warm_started(compose(small).model, task))[0]
    assert any(not torch.equal(a, b) for a, b in zip(start.parameters(), warm.parameters()))
    assert json.loads((tmp_path / "rft" / "status.json").read_text())["state"] == "completed"


def test_rft_takes_no_step_when_nothing_is_correct(small, tmp_path, monkeypatch):
    """A verifier that accepts nothing: every step is logged as skipped, and the weights and the
    optimizer never move (AdamW's weight decay alone would move them)."""
    from grpo_ablate.tasks.arithmetic import ArithmeticTask
    from grpo_ablate.models import ensure_warm_started

    monkeypatch.setattr(ArithmeticTask, "reward", lambda self, completion, problem: 0.0)
    assert run_hydra([*small, "control=rft", "steps=2", f"hydra.run.dir={tmp_path / 'none'}"]) == 0
    data = rows(tmp_path / "none")[1:]
    assert [(r["rft/skipped"], r["rft/kept_frac"], r["perf/completion_tokens"]) for r in data] == [(1, 0.0, 0)] * 2
    assert not any("loss" in r for r in data)
    cfg = compose(small)
    warm = load_model_and_tokenizer(ensure_warm_started(cfg.model, build_task(cfg.task)))[0]
    kept = load_model_and_tokenizer(tmp_path / "none" / "checkpoint")[0]
    for (name, a), b in zip(warm.state_dict().items(), kept.state_dict().values()):
        assert torch.equal(a, b), name


def test_rft_resumes_exactly(small, tmp_path):
    """Stopped after its checkpoint at step 2 and resumed to step 4: the uninterrupted run's rows."""
    assert run_hydra([*small, "control=rft", f"hydra.run.dir={tmp_path / 'full'}"]) == 0
    assert run_hydra([*small, "control=rft", "steps=2", f"hydra.run.dir={tmp_path / 'part'}"]) == 0
    assert run_hydra([*small, "control=rft", "resume=true", f"hydra.run.dir={tmp_path / 'part'}"]) == 0
    assert untimed(tmp_path / "part") == untimed(tmp_path / "full")


def test_rft_with_lora_trains_the_adapters_only_as_a_grpo_run_does(tiny_models, tmp_path, monkeypatch):
    """model.lora.r > 0: the control trains (and checkpoints) the LoRA adapters alone, so it is
    compared with GRPO runs at the same trained parameters and optimizer settings."""
    from safetensors.torch import load_file

    from conftest import REPO
    from grpo_ablate.tasks.dataset import JsonlTask

    monkeypatch.setattr(JsonlTask, "reward", lambda self, completion, problem: 1.0)   # every sample kept
    run_dir = tmp_path / "lora"
    assert run_hydra(["model=hf", f"model.path={tiny_models['llama']}", "model.lora.r=4", "task=jsonl",
                      f"task.path={REPO / 'tests' / 'data' / 'word_problems.jsonl'}", "task.eval_size=2", "steps=2",
                      "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=6", "logger=none",
                      "threads=1", "eval.every=2", "checkpoint_every=2", "control=rft", "optim.lr=1e-2",
                      f"hydra.run.dir={run_dir}"]) == 0
    data = rows(run_dir)[1:]
    assert [r["rft/kept_frac"] for r in data] == [1.0, 1.0] and data[0]["optim/grad_norm"] > 0
    adapters = load_file(run_dir / "checkpoint" / "adapter_model.safetensors")
    assert adapters and all("lora_" in k for k in adapters)
    assert not (run_dir / "checkpoint" / "model.safetensors").exists()
