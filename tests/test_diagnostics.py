"""Gradient-conflict diagnostics: the math on hand-built terms (float64), and real short runs —
the logged metrics show a length bonus fighting an overlong penalty, and switching the
diagnostics on never changes what a run trains."""
import statistics

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import grpo_ablate.train.diagnostics as diagnostics_module
import grpo_ablate.train.forward as forward_module
import grpo_ablate.train.grpo as trainer_module
from grpo_ablate.train import diagnostics as diag
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows
from grpo_ablate.config.spec import run_spec
from grpo_ablate.tricks.adv.group import grpo_advantage


# ------------------------------------------------------------------------------ the math
def linear_terms(u, v):
    """Two loss terms on one parameter vector w whose gradients are exactly u and v."""
    w = torch.zeros(len(u), dtype=torch.float64, requires_grad=True)
    u, v = torch.tensor(u, dtype=torch.float64), torch.tensor(v, dtype=torch.float64)
    return {"a": w @ u, "b": w @ v}, [w]


@pytest.mark.parametrize("v, expected", [
    ([2.0, 4.0, -6.0], 1.0),       # parallel (twice as long)
    ([2.0, -1.0, 0.0], 0.0),       # orthogonal
    ([-0.5, -1.0, 1.5], -1.0),     # opposite
])
def test_cosine_of_hand_built_terms(v, expected):
    terms, params = linear_terms([1.0, 2.0, -3.0], v)
    grads = diag.term_gradients(terms, params)
    assert grads["a"].dtype == torch.float64
    assert grads["a"].tolist() == [1.0, 2.0, -3.0] and grads["b"].tolist() == v
    metrics = diag.conflict_metrics(grads)
    assert metrics["grad_cos/a__b"] == pytest.approx(expected, abs=1e-12)
    assert metrics["grad_norm/a"] == pytest.approx(14 ** 0.5, abs=1e-12)
    assert metrics["grad_norm/b"] == pytest.approx(float(torch.tensor(v).norm()), abs=1e-6)


def test_terms_on_several_parameters_and_a_term_that_moves_nothing():
    x = torch.tensor([1.0, -1.0], requires_grad=True)
    y = torch.tensor([[2.0]], requires_grad=True)
    terms = {"a": (3 * x).sum() + y.sum(), "b": -(3 * x).sum() - y.sum(), "still": (x * 0).sum()}
    grads = diag.term_gradients(terms, [x, y])
    assert grads["a"].tolist() == [3.0, 3.0, 1.0]       # flattened over both tensors
    metrics = diag.conflict_metrics(grads)
    assert metrics["grad_cos/a__b"] == pytest.approx(-1.0)
    assert metrics["grad_norm/still"] == 0.0
    assert "grad_cos/a__still" not in metrics            # no direction, no cosine
    # a term that does not reach a parameter gets zeros there, not an error
    assert diag.flat_grad(x.sum(), [x, y]).tolist() == [1.0, 1.0, 0.0]
    assert diag.cosine(torch.zeros(3), torch.ones(3)) is None


def test_component_advantages_use_the_runs_advantage_function():
    group_index = torch.tensor([0, 0, 0, 1, 1, 1])
    task = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    length = torch.tensor([0.1, 0.3, 0.2, 0.5, 0.4, 0.6])
    advantage_of = lambda r: grpo_advantage(r, group_index, None, None, {})
    out = diag.component_advantages({"task_reward": task, "overlong_reward": torch.zeros(6),
                                     "length_reward": length}, advantage_of)
    assert list(out) == ["task_reward", "length_reward"]          # an all-zero component adds nothing
    assert torch.equal(out["task_reward"], grpo_advantage(task, group_index, None, None, {}))
    assert torch.equal(out["length_reward"], grpo_advantage(length, group_index, None, None, {}))
    assert out["task_reward"][3:].abs().max() == 0                 # a flat group has no signal
    # GRPO divides by each group's std: the components' advantages need not add up
    assert not torch.allclose(out["task_reward"] + out["length_reward"], advantage_of(task + length))
    # a reward with no shaping term is not split (its one component is the policy term)
    assert diag.component_advantages({"task_reward": task, "length_reward": torch.zeros(6)}, advantage_of) == {}


def test_pick_rows_takes_whole_groups_with_signal_first():
    group_index = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    informative = torch.tensor([False, False, False, False, True, False, False, True])
    assert diag.pick_rows(group_index, informative, 4).tolist() == [4, 5, 6, 7]
    assert diag.pick_rows(group_index, informative, 5).tolist() == [4, 5, 6, 7]     # whole groups only
    assert diag.pick_rows(group_index, informative, 6).tolist() == [0, 1, 4, 5, 6, 7]
    assert diag.pick_rows(group_index, informative, 1).tolist() == [4, 5]           # at least one group
    assert diag.pick_rows(group_index, informative, None).tolist() == list(range(8))


def test_last_layer_params_are_the_last_blocks():
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=3,
                                         num_attention_heads=2, num_key_value_heads=1))
    last = diag.last_layer_params(model, 1)
    assert {id(p) for p in last} == {id(p) for p in model.model.layers[2].parameters()}
    two = diag.last_layer_params(model, 2)
    assert len(two) == 2 * len(last)
    assert len(diag.last_layer_params(model, None)) == len(list(model.parameters()))


def test_diag_config_is_validated():
    for bad, needle in [("diag.every=0", "diag.every=0"), ("diag.rows=-3", "diag.rows=-3"),
                        ("diag.last_layers=1.5", "diag.last_layers=1.5"), ("diag.grad_conflict=2", "true, false")]:
        with pytest.raises(ConfigError, match=needle):
            validate(compose([bad]))


# ------------------------------------------------------------------------------ real runs
def run(overrides, run_dir):
    result = trainer_module.train(compose(overrides), run_dir, overrides)
    assert result.state == "completed", result.reason
    return read_rows(run_dir / "metrics.jsonl")


# a length *bonus* (length.lam < 0 favours long outputs) against DAPO's overlong punishment,
# which from |o| > max_new_tokens - buffer = 8 favours short ones
LONG_VS_SHORT = ["length=penalty", "length.lam=-0.5", "overlong=soft_punish", "overlong.buffer=8"]


def test_a_length_bonus_against_an_overlong_penalty_shows_a_negative_cosine(small, tmp_path):
    rows = run(small + LONG_VS_SHORT + ["steps=6", "diag.grad_conflict=true", "diag.every=1"], tmp_path / "run")
    cosines = [r["grad_cos/overlong_reward__length_reward"] for r in rows[1:]
               if "grad_cos/overlong_reward__length_reward" in r]
    assert len(cosines) >= 5, rows[1]
    assert statistics.median(cosines) < -0.5 and sum(c < 0 for c in cosines) > len(cosines) / 2, cosines
    step = rows[1]
    for term in ("policy", "kl", "task_reward", "overlong_reward", "length_reward"):
        assert f"grad_norm/{term}" in step
    assert "grad_cos/policy__task_reward" in step and step["time/diag_s"] > 0


@pytest.mark.parametrize("tricks, terms", [
    (LONG_VS_SHORT, {"policy", "kl", "task_reward", "overlong_reward", "length_reward"}),
    (["adv=gae", "kl=two_layer", "entropy=bonus"], {"policy", "value", "kl", "kl_prev", "entropy"}),
    (["kl=in_reward", "length=group"], {"policy", "task_reward", "length_reward", "kl_reward"}),
])
def test_diagnostics_never_change_training(small, tmp_path, tricks, terms):
    """Same metrics with the diagnostics on at every step as off, bit for bit."""
    base = small + tricks + ["steps=3"]
    off = run(base, tmp_path / "off")
    on = run(base + ["diag.grad_conflict=true", "diag.every=1", "diag.rows=8"], tmp_path / "on")
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES + ("grad_",))}
                          for r in rows]
    assert strip(on) == strip(off)
    assert {k.split("/", 1)[1] for k in on[2] if k.startswith("grad_norm/")} == terms
    assert not any(k.startswith("grad_") for r in off for k in r)


def test_the_diagnostics_differentiate_the_token_mask_the_update_trains(small, tmp_path, monkeypatch):
    """token_mask=high_entropy keeps the top-entropy tokens of the batch: the diagnostics' sub-batch
    (diag.rows) gets the update's kept tokens (its rows of the whole batch's quantile), not a
    quantile of its own rows."""
    from grpo_ablate.train.losses import LossTerms

    factors, picked = [], []
    real_factor, real_pick = LossTerms.policy_factor, diagnostics_module.pick_rows

    def record_factor(self, logp, entropy, inputs, spread=None):
        out = real_factor(self, logp, entropy, inputs, spread)
        factors.append((out[0].detach().clone(), entropy.detach().clone(), inputs.mask))
        return out

    monkeypatch.setattr(LossTerms, "policy_factor", record_factor)
    monkeypatch.setattr(diagnostics_module, "pick_rows", lambda *a: picked.append(real_pick(*a)) or picked[-1])
    run(small + ["steps=1", "token_mask=high_entropy", "token_mask.quantile=0.3", "diag.grad_conflict=true",
                 "diag.every=1", "diag.rows=4", "kl=none"], tmp_path / "run")
    # step 1: the diagnostics' terms, then (policy_factor of the component terms) and the update's
    (rows,) = picked
    (diagnosed, sub_entropy, sub_mask), updated = factors[0], factors[-1][0]
    assert len(rows) < len(updated) and diagnosed.shape[0] == len(rows)
    assert torch.equal(diagnosed, updated[rows])
    # what the sub-batch's own quantile keeps (the old behaviour) is another set of tokens here
    own = LossTerms(run_spec(compose(["token_mask=high_entropy", "token_mask.quantile=0.3"])).tricks).token_keep(
        sub_entropy, sub_mask)
    assert not torch.equal(own, diagnosed)


def test_off_costs_no_extra_work(small, tmp_path, monkeypatch):
    """Off (the default), a step calls no diagnostics function and no extra forward."""
    calls = []
    for name in ("last_layer_params", "pick_rows", "term_gradients", "component_advantages"):
        monkeypatch.setattr(diagnostics_module, name, lambda *a, _n=name, **k: calls.append(_n))
    forwards = []
    real = forward_module.completion_logprobs
    monkeypatch.setattr(forward_module, "completion_logprobs", lambda *a, **k: forwards.append(1) or real(*a, **k))
    run(small + ["steps=2", "kl=none"], tmp_path / "run")
    assert calls == [] and len(forwards) == 2          # one policy forward per step, as without diag
