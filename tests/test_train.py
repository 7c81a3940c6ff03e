"""Real (small) training runs in-process: the run dir contract, determinism, passes, NaNs."""
import dataclasses
import functools
import json
import warnings
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpo_ablate.train.forward as forward_module
import grpo_ablate.train.grpo as trainer_module
from grpo_ablate.config.compose import compose
from grpo_ablate.errors import ConfigError
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows
from grpo_ablate.tricks import option, registry
from grpo_ablate.train.grpo import train

REQUIRED_STEP_KEYS = [
    "loss", "reward/mean", "reward/std", "train/accuracy", "length/mean", "length/max",
    "length/truncated_frac", "policy/entropy", "kl/k1", "kl/k3", "kl/beta", "clip/low_frac",
    "clip/high_frac", "adv/mean", "adv/std", "adv/min", "adv/max", "adv/zero_std_group_frac",
    "optim/grad_norm", "optim/lr", "time/sample_s", "time/reward_s", "time/reference_s",
    "time/update_s", "perf/tokens_per_s",
]


def run(overrides, run_dir):
    return train(compose(overrides), run_dir, overrides)


def without_timing(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]


@pytest.mark.fast   # the fast tier's real run: a GRPO run of the small model to the run-dir contract
def test_run_dir_contract(small, tmp_path):
    result = run(small, tmp_path / "run")
    assert result.state == "completed" and result.exit_code == 0
    d = tmp_path / "run"
    status = json.loads((d / "status.json").read_text())
    assert status["state"] == "completed" and status["step"] == 4 and status["config_hash"]
    assert "${" not in (d / "config.yaml").read_text()            # resolved
    assert "rollout.group_size=4" in (d / "overrides.yaml").read_text()
    rows = read_rows(d / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[2] and "eval/accuracy" in rows[4]
    for key in REQUIRED_STEP_KEYS:
        assert all(key in r for r in rows[1:]), key
    assert rows[1]["clip/low_frac"] == 0 and rows[1]["clip/high_frac"] == 0   # rho == 1
    samples = read_rows(d / "samples.jsonl")
    assert {s["step"] for s in samples} == {2, 4} and {"prompt", "completion", "reward"} <= set(samples[0])
    # the checkpoint is an ordinary transformers checkpoint
    model = AutoModelForCausalLM.from_pretrained(d / "checkpoint")
    assert sum(p.numel() for p in model.parameters()) > 0
    assert not (d / "checkpoint.tmp").exists() and not (d / "checkpoint.old").exists()


def test_same_seed_gives_identical_metrics(small, tmp_path):
    a = read_rows(run(small, tmp_path / "a").run_dir / "metrics.jsonl")
    b = read_rows(run(small, tmp_path / "b").run_dir / "metrics.jsonl")
    c = read_rows(run(small + ["seed=1"], tmp_path / "c").run_dir / "metrics.jsonl")
    assert without_timing(a) == without_timing(b)
    assert without_timing(a) != without_timing(c)


class CountingLogprobs:
    def __init__(self):
        self.calls = 0
        self.wrapped = forward_module.completion_logprobs

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.wrapped(*args, **kwargs)


@pytest.mark.parametrize("extra, forwards_per_step, has_kl", [
    (["kl=none"], 1, False),                                 # policy only: no pi_ref, no pi_old
    (["kl=fixed"], 2, True),                                 # + one reference forward
    (["kl=none", "metrics.ref_kl=true"], 2, True),           # reference only for the metric
    (["kl=none", "updates.epochs=2"], 3, False),     # pi_old once + two updates
    (["kl=in_reward"], 3, True),                             # pi_ref + pi_old for the reward
])
def test_no_redundant_forward_passes(small, tmp_path, monkeypatch, extra, forwards_per_step, has_kl):
    counter = CountingLogprobs()
    monkeypatch.setattr(forward_module, "completion_logprobs", counter)
    run(small + ["steps=2"] + extra, tmp_path / "run")
    assert counter.calls == 2 * forwards_per_step
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")
    assert ("kl/k3" in rows[1]) == has_kl


def test_kl_none_loads_no_reference_model(small, tmp_path, monkeypatch):
    loads = []
    real = trainer_module.load_model_and_tokenizer
    monkeypatch.setattr(trainer_module, "load_model_and_tokenizer", lambda p, **kw: loads.append(p) or real(p, **kw))
    monkeypatch.setattr(trainer_module, "copy", SimpleNamespace(deepcopy=lambda *_: pytest.fail("reference copied")))
    run(small + ["steps=1", "kl=none"], tmp_path / "run")
    assert len(loads) == 1


def test_fixed_kl_adds_beta_times_k3(small, tmp_path):
    """With beta > 0 the loss is the policy loss plus beta * mean k3, aggregated alike."""
    rows = read_rows(run(small + ["steps=3", "kl.beta=0.5"], tmp_path / "run").run_dir / "metrics.jsonl")
    assert all(r["kl/beta"] == 0.5 for r in rows[1:])
    assert rows[1]["kl/k3"] == pytest.approx(0.0, abs=1e-6)     # pi_theta == pi_ref at step 1
    assert rows[3]["kl/k3"] > 0                                   # and drifts after updates


def test_policy_moves_so_the_equality_tests_mean_something(small, tmp_path):
    result = run(small + ["steps=3", "kl=none", "metrics.ref_kl=true"], tmp_path / "run")
    rows = read_rows(result.run_dir / "metrics.jsonl")
    assert any(r["adv/zero_std_group_frac"] < 1 for r in rows[1:])   # some groups have signal
    assert rows[3]["kl/k1"] != 0 and rows[3]["optim/grad_norm"] > 0


def test_exploding_weights_mark_the_run_diverged(small, tmp_path):
    # An absurd learning rate with weight decay blows the weights up after one step: a real
    # divergence, which first shows as non-finite logits in the next rollout.
    result = run(small + ["steps=6", "optim.lr=1e30", "optim.weight_decay=0.5"], tmp_path / "run")
    assert result.state == "diverged" and result.exit_code == 3
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "diverged" and status["step"] == 2
    assert "non-finite" in status["reason"]


def nan_at_step(monkeypatch, bad_steps):
    """Make the policy loss NaN on the given steps (counted from 1)."""
    calls = {"n": 0}
    real = option("clip", "symmetric")

    @functools.wraps(real.impl)   # the same signature: the same knobs
    def loss(*args, **kwargs):
        calls["n"] += 1
        value, stats = real.impl(*args, **kwargs)
        return (value * float("nan") if calls["n"] in bad_steps else value), stats
    monkeypatch.setitem(registry._FAMILIES["clip"], "symmetric", dataclasses.replace(real, impl=loss))


def test_forced_nan_loss_marks_the_run_diverged_at_that_step(small, tmp_path, monkeypatch):
    nan_at_step(monkeypatch, {3})
    result = run(small + ["steps=6"], tmp_path / "run")
    assert (result.state, result.step, result.exit_code) == ("diverged", 3, 3)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "diverged" and status["reason"] == "non-finite loss at step 3"
    last = read_rows(tmp_path / "run" / "metrics.jsonl")[-1]
    assert last["step"] == 3 and last["loss"] is None        # NaN is written as null (strict JSON)
    # a diverged run is a finished result: resuming it changes nothing
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    again = run(small + ["steps=6", "resume=true"], tmp_path / "run")
    assert again.state == "diverged" and (tmp_path / "run" / "metrics.jsonl").read_text() == before


def test_on_nonfinite_skip_drops_the_step_and_keeps_going(small, tmp_path, monkeypatch):
    nan_at_step(monkeypatch, {2, 3})
    result = run(small + ["steps=4", "on_nonfinite=skip"], tmp_path / "run")
    assert result.state == "completed"
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")
    assert [r["optim/skipped_steps"] for r in rows[1:]] == [0, 1, 2, 2]


def test_existing_run_dir_is_not_overwritten(small, tmp_path):
    run(small + ["steps=1"], tmp_path / "run")
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="--resume"):
        run(small + ["steps=1"], tmp_path / "run")
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before


def test_resume_refuses_a_changed_config(small, tmp_path):
    run(small + ["steps=2"], tmp_path / "run")
    with pytest.raises(ConfigError, match="config differs"):
        run(small + ["steps=4", "optim.lr=1e-3", "resume=true"], tmp_path / "run")


def test_resume_extends_a_completed_run_identically(small, tmp_path):
    full = read_rows(run(small + ["steps=4"], tmp_path / "full").run_dir / "metrics.jsonl")
    run(small + ["steps=2"], tmp_path / "part")
    run(small + ["steps=4", "resume=true"], tmp_path / "part")
    assert without_timing(read_rows(tmp_path / "part" / "metrics.jsonl")) == without_timing(full)


def test_warm_start_cache_is_content_addressed(small, cache_dir, tmp_path):
    run(small + ["steps=1"], tmp_path / "a")
    entries = {p.name for p in cache_dir.iterdir() if p.name.startswith("tiny-")}
    run(small + ["steps=1", "model.warmup.steps=41"], tmp_path / "b")
    after = {p.name for p in cache_dir.iterdir() if p.name.startswith("tiny-")}
    assert len(after - entries) == 1                   # a changed warm-up builds a new entry
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".")]   # no temp leftovers
    entry = cache_dir / sorted(after - entries)[0]
    assert (entry / "config.json").exists()
    assert json.loads((entry / "warm_start.json").read_text())["warmup"]["steps"] == 41
    with torch.no_grad():    # loads through from_pretrained like any model
        AutoModelForCausalLM.from_pretrained(entry)(torch.tensor([[3, 4]]))


@pytest.mark.parametrize("option, metric", [
    ("adv=lite", "adv/std"), ("adv=batch", "adv/std"), ("adv=rloo", "adv/std"),
    ("adv=rpp_baseline", "adv/std"), ("reward_norm=batch", "reward/mean"),
    ("adv_clip=clip", "adv/clipped_frac"), ("clip=higher", "clip/high_frac"),
    ("dual_clip=enabled", "clip/dual_frac"), ("overlong=filter", "overlong/masked_frac"),
    ("overlong=soft_punish", "overlong/penalty_mean"), ("length=penalty", "length/reward_mean"),
    ("length=group", "length/reward_mean"), ("entropy=bonus", "entropy/coef"),
    ("entropy=adaptive", "entropy/coef"), ("kl=adaptive", "kl/beta"), ("kl=adaptive_target", "kl/beta"),
    ("temperature=learnable", "temperature/value"), ("kl_weight=length_budget", "kl/k3"),
    ("kl_weight=entropy", "kl/k3"), ("kl=in_reward", "kl/k1"), ("kl=two_layer", "kl/prev_k3"),
    ("sampling=dynamic_group", "sampling/mean_group_size"), ("adv=gae", "value/explained_variance"),
    ("adv=gae value_clip=clip", "value/loss"),
])
def test_every_trick_option_trains(small, tmp_path, option, metric):
    extra = ["overlong.buffer=4"] if option == "overlong=soft_punish" else []
    result = run(small + ["steps=2", "updates.epochs=2", *option.split()] + extra, tmp_path / "run")
    assert result.state == "completed"
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")
    assert all(metric in r for r in rows[1:])
    assert all(v is not None for r in rows for v in r.values())   # finite (NaN would be null)


def test_entropy_bonus_changes_the_update(small, tmp_path):
    """With c > 0 the entropy term reaches the gradient: same seed, different weights."""
    plain = read_rows(run(small + ["steps=2", "kl=none"], tmp_path / "a").run_dir / "metrics.jsonl")
    bonus = read_rows(run(small + ["steps=2", "kl=none", "entropy=bonus", "entropy.coef=0.5"],
                           tmp_path / "b").run_dir / "metrics.jsonl")
    assert plain[1]["optim/grad_norm"] != bonus[1]["optim/grad_norm"]
    assert bonus[1]["entropy/coef"] == 0.5 and plain[1]["entropy/coef"] == 0.0


class ScriptedTask:
    """The real task, except that training rewards follow a script: script[round] lists each
    group's rewards (G values) for the rounds of step 1; eval rewards are 0."""

    def __init__(self, real, script):
        self.real, self.script, self.round = real, script, 0
        self.chars, self.eval_set, self.describe = real.chars, real.eval_set, real.describe
        self.warmup_batch, self.demonstration = real.warmup_batch, real.demonstration
        self.served = {}

    def train_batch(self, n, seed, step, round=0):
        self.round = round
        problems = self.real.train_batch(n, seed, step, round)
        self.served = {id(p): g for g, p in enumerate(problems)}
        self.counts = [0] * n
        return problems

    def reward(self, completion, problem):
        group = self.served.get(id(problem))
        if group is None:
            return 0.0
        value = self.script[self.round][group][self.counts[group]]
        self.counts[group] += 1
        return value


SCRIPT = [   # B = 4 groups of G = 4
    [[0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]],   # round 0: 1 group varies
    [[1, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]],   # round 1: 2 more
    [[0, 0, 1, 0], [1, 0, 1, 0], [0, 1, 0, 0], [1, 1, 1, 1]],   # round 2: 3 vary, 1 needed
]


@pytest.mark.parametrize("max_rounds, rounds, groups", [(4, 3, 4), (2, 2, 3), (1, 1, 1)])
def test_dynamic_sampling_refills_the_batch_and_respects_the_cap(small, tmp_path, monkeypatch,
                                                                  max_rounds, rounds, groups):
    real_build = trainer_module.build_task
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: ScriptedTask(real_build(cfg), SCRIPT))
    result = run(small + ["steps=1", "sampling=dynamic", f"sampling.max_rounds={max_rounds}", "adv=dr_grpo"],
                 tmp_path / "run")
    assert result.state == "completed"          # the cap never crashes the run
    row = read_rows(tmp_path / "run" / "metrics.jsonl")[1]
    assert row["sampling/rounds"] == rounds
    assert row["sampling/kept_group_frac"] == pytest.approx(groups / (4 * rounds))
    assert row["adv/zero_std_group_frac"] == 0.0            # only groups with signal were kept
    # the kept groups' rewards, in order: dr_grpo advantages are r - group mean
    kept = [g for r in SCRIPT[:rounds] for g in r if max(g) > min(g)][:groups]
    assert row["train/accuracy"] == pytest.approx(sum(map(sum, kept)) / (4 * groups))


def test_static_sampling_is_one_round(small, tmp_path):
    row = read_rows(run(small + ["steps=1"], tmp_path / "run").run_dir / "metrics.jsonl")[1]
    assert row["sampling/rounds"] == 1 and row["sampling/kept_group_frac"] == 1.0


def test_learnable_temperature_moves_during_training_and_resumes(small, tmp_path):
    args = small + ["steps=4", "kl=none", "temperature=learnable", "temperature.lr=0.05"]
    with warnings.catch_warnings(record=True) as caught:   # the trained temperature is read as a number
        warnings.simplefilter("always")
        full = read_rows(run(args, tmp_path / "full").run_dir / "metrics.jsonl")
    assert not [w for w in caught if "requires_grad" in str(w.message)], [str(w.message) for w in caught]
    temps = [r["temperature/value"] for r in full[1:]]
    assert temps[0] == 1.0 and len(set(temps)) > 1
    run(small + ["steps=2", "kl=none", "temperature=learnable", "temperature.lr=0.05"], tmp_path / "part")
    run(args + ["resume=true"], tmp_path / "part")
    assert without_timing(read_rows(tmp_path / "part" / "metrics.jsonl")) == without_timing(full)


def test_two_layer_kl_anchors_to_the_policy_of_prev_lag_steps_ago_and_resumes(small, tmp_path):
    args = small + ["steps=6", "kl=two_layer", "kl.prev_lag=2", "kl.beta_prev=0.5"]
    full = read_rows(run(args, tmp_path / "full").run_dir / "metrics.jsonl")
    prev = [r["kl/prev_k3"] for r in full[1:]]
    ref = [r["kl/k3"] for r in full[1:]]
    # steps 1-3: the anchor is still the start (= pi_ref), so both KLs agree; after that it moves on
    assert prev[0] == pytest.approx(0.0, abs=1e-6) and prev[:3] == pytest.approx(ref[:3])
    assert prev[4] != pytest.approx(ref[4])
    # (a part that ends on an eval step, so its last row matches the uninterrupted run's)
    run(small + ["steps=4", "kl=two_layer", "kl.prev_lag=2", "kl.beta_prev=0.5"], tmp_path / "part")
    run(args + ["resume=true"], tmp_path / "part")
    assert without_timing(read_rows(tmp_path / "part" / "metrics.jsonl")) == without_timing(full)


def test_dynamic_group_size_grows_flat_groups_into_ragged_ones(small, tmp_path, monkeypatch):
    script = [[
        [0, 0, 0, 0, 0, 1, 9, 9],      # flat at 4: grows by 2, then varies -> 6 completions
        [1, 1, 1, 1, 1, 1, 1, 1],      # never varies: grows to the cap, 8
        [1, 0, 0, 0, 9, 9, 9, 9],      # varies at once: 4
        [0, 0, 0, 0, 0, 0, 0, 0],      # cap: 8
    ]]
    real_build = trainer_module.build_task
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: ScriptedTask(real_build(cfg), script))
    result = run(small + ["steps=1", "sampling=dynamic_group", "sampling.g_step=2", "sampling.g_max=8",
                          "adv=dr_grpo"], tmp_path / "run")
    assert result.state == "completed"
    row = read_rows(tmp_path / "run" / "metrics.jsonl")[1]
    assert row["sampling/mean_group_size"] == (6 + 8 + 4 + 8) / 4
    assert row["sampling/extra_generations"] == 26 - 16
    assert row["train/accuracy"] == pytest.approx((1 + 8 + 1 + 0) / 26)
    assert row["adv/zero_std_group_frac"] == 0.5      # groups 1 and 3 stayed flat at the cap


def test_critic_learns_and_resumes(small, tmp_path):
    args = small + ["steps=4", "kl=none", "adv=gae", "value_clip=clip"]
    full = read_rows(run(args, tmp_path / "full").run_dir / "metrics.jsonl")
    assert all(r["value/loss"] >= 0 for r in full[1:])
    run(small + ["steps=2", "kl=none", "adv=gae", "value_clip=clip"], tmp_path / "part")
    run(args + ["resume=true"], tmp_path / "part")      # the value head is in the checkpoint
    assert without_timing(read_rows(tmp_path / "part" / "metrics.jsonl")) == without_timing(full)
