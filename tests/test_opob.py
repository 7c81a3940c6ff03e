"""adv=opob, VCPO's optimal off-policy baseline, against its source in float64.

Reference: mit-han-lab/vcpo, commit c7f030f0b77237cfb0e75e720669e2917a1bb56e:
recipe/fully_async_policy/vcpo.py `compute_opob_baseline` (W_i = grad_norm^2 x seq_is_ratio^2
[/ length^2], `get_weighted_mean`: sum v w / (sum w + 1e-8)) and verl/workers/actor/
megatron_actor.py `_update_grad_buffers` (the group's gradient is sum_i g_i r_i - b sum_i g_i;
norm_by_std divides both by the population std where it is > 1e-8). The expected numbers below
are that arithmetic in plain floats.
"""
import math
from types import SimpleNamespace

import pytest
import torch

from conftest import refused_train
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.rundir.files import read_rows
from grpo_ablate.sampling.decode import Rollout
from grpo_ablate.train.grpo import train
from grpo_ablate.train.state.adv import score_norms
from grpo_ablate.tricks import option

D = torch.float64

# group 0: rewards 1 0 0 1, ||g||^2 4 1 1 2, log rho 0 ln2 0 0 (rho 1 2 1 1), lengths 2 2 2 1;
# group 1: rewards .5 .2, ||g||^2 1 3, on-policy
REWARDS, GROUPS = [1.0, 0.0, 0.0, 1.0, 0.5, 0.2], [0, 0, 0, 0, 1, 1]
NORMS, LOG_RHO = [4.0, 1.0, 1.0, 2.0, 1.0, 3.0], [0.0, math.log(2), 0.0, 0.0, 0.0, 0.0]
MASK = [[1, 1], [1, 1], [1, 1], [1, 0], [1, 1], [1, 1]]


def opob(**knobs):
    values = torch.tensor([NORMS, LOG_RHO], dtype=D).T
    return option("adv", "opob").bind(knobs)(torch.tensor(REWARDS, dtype=D), torch.tensor(GROUPS),
                                             torch.tensor(MASK, dtype=D), values, {})


def vcpo_baseline(rewards, weights):
    """vcpo.py get_weighted_mean, as written there."""
    return sum(r * w for r, w in zip(rewards, weights)) / (sum(weights) + 1e-8)


def expected(weights):
    b0, b1 = vcpo_baseline(REWARDS[:4], weights[:4]), vcpo_baseline(REWARDS[4:], weights[4:])
    return torch.tensor([r - (b0 if g == 0 else b1) for r, g in zip(REWARDS, GROUPS)], dtype=D)


def test_opob_is_vcpos_weighted_mean_with_the_squared_importance_ratio():
    # use_is_weights (VCPO's default): W = ||g||^2 rho^2 = 4 4 1 2 | 1 3: b0 = 6/11, b1 = 1.1/4
    torch.testing.assert_close(opob(), expected([4, 4, 1, 2, 1, 3]), atol=1e-12, rtol=0)
    assert opob()[0].item() == pytest.approx(1 - 6 / 11, abs=1e-9)
    torch.testing.assert_close(opob(is_weights=False), expected(NORMS), atol=1e-12, rtol=0)     # b0 = 6/8
    # normalize_by_length: W / L^2 = 1 1 .25 2 | .25 .75
    torch.testing.assert_close(opob(length_normalize=True), expected([1, 1, 0.25, 2, 0.25, 0.75]), atol=1e-12, rtol=0)


def test_opob_std_normalize_divides_by_the_population_std_and_leaves_a_flat_group():
    std0 = math.sqrt(sum((r - 0.5) ** 2 for r in REWARDS[:4]) / 4)        # 0.5 (unbiased=False)
    std1 = math.sqrt(((0.5 - 0.35) ** 2 + (0.2 - 0.35) ** 2) / 2)          # 0.15
    want = expected([4, 4, 1, 2, 1, 3]) / torch.tensor([std0] * 4 + [std1] * 2, dtype=D)
    torch.testing.assert_close(opob(std_normalize=True), want, atol=1e-10, rtol=0)
    flat = option("adv", "opob").bind({"std_normalize": True})(
        torch.tensor([1.0, 1.0], dtype=D), torch.tensor([0, 0]), torch.ones(2, 1, dtype=D),
        torch.tensor([[1.0, 0.0], [2.0, 0.0]], dtype=D), {})
    torch.testing.assert_close(flat, torch.tensor([1.0 - 3 / (3 + 1e-8)] * 2, dtype=D))   # std 0: r - b


def test_a_row_without_trained_tokens_weighs_nothing_and_a_group_of_weightless_rows_has_baseline_zero():
    rewards, groups = torch.tensor([1.0, 0.0, 0.7], dtype=D), torch.tensor([0, 0, 1])
    values = torch.tensor([[5.0, 0.0], [1.0, 0.0], [0.0, 0.0]], dtype=D)
    got = option("adv", "opob").bind({})(rewards, groups, torch.tensor([[0, 0], [1, 1], [1, 1]], dtype=D), values, {})
    torch.testing.assert_close(got, torch.tensor([1.0, 0.0, 0.7], dtype=D), atol=1e-7, rtol=0)


def test_the_baseline_minimizes_the_second_moment_of_real_per_trajectory_gradients():
    """The claim the trick rests on, with real gradients: a softmax policy over 5 tokens with
    parameters theta, trajectories of 3 tokens; g_i = grad sum_t log pi(o_t) by autograd, one per
    trajectory. sum_i ||g_i (r_i - b)||^2 is smallest at OPOB's b (is_weights off: on-policy), and
    not at the group mean GRPO uses."""
    torch.manual_seed(0)
    theta = torch.randn(5, dtype=D, requires_grad=True)
    tokens = torch.randint(0, 5, (6, 3))
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=D)
    grads = torch.stack([torch.autograd.grad(torch.log_softmax(theta, 0)[row].sum(), theta)[0] for row in tokens])
    values = torch.stack([grads.pow(2).sum(1), torch.zeros(6, dtype=D)], dim=1)
    adv = option("adv", "opob").bind({"is_weights": False})(rewards, torch.zeros(6, dtype=torch.long),
                                                            torch.ones(6, 3, dtype=D), values, {})
    b_star = (rewards - adv)[0].detach()
    b = b_star.clone().requires_grad_(True)
    moment = ((grads * (rewards - b)[:, None]) ** 2).sum()
    assert torch.autograd.grad(moment, b)[0].item() == pytest.approx(0.0, abs=1e-6)   # stationary (eps: 1e-8)
    second_moment = lambda c: float(((grads * (rewards - c)[:, None]) ** 2).sum())
    assert second_moment(b_star) < second_moment(rewards.mean())
    assert all(second_moment(b_star) <= second_moment(b_star + d) for d in (-0.1, -0.01, 0.01, 0.1))


class TinyLM(torch.nn.Module):
    """A language model small enough to take every row's gradient by hand: logits = E[x] W."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Embedding(7, 4)
        self.head = torch.nn.Linear(4, 7, bias=False)

    def forward(self, input_ids, attention_mask=None, **_):
        return SimpleNamespace(logits=self.head(self.embed(input_ids)))


def test_score_norms_are_each_rows_own_gradient_and_log_ratio():
    model = TinyLM().double()
    ids = torch.tensor([[5, 1, 2, 3], [5, 4, 6, 0]])      # one prompt token, three completion tokens
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    sampler = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, -1.5, 0.0]], dtype=D)   # nan: unknown
    roll = Rollout(ids, torch.ones_like(ids), 1, mask, torch.zeros(2, dtype=torch.bool), sampler_logprobs=sampler)
    T = 0.8
    got = score_norms(model, roll, T, remove_padding=False)
    for i in range(2):
        model.zero_grad()
        logp = torch.log_softmax(model(ids[i:i + 1]).logits[0, :-1] / T, dim=-1)     # position t predicts t+1
        chosen = logp[torch.arange(3), ids[i, 1:]]
        (chosen * mask[i].double()).sum().backward()
        squared = sum(float(p.grad.pow(2).sum()) for p in model.parameters())
        assert got[i, 0].item() == pytest.approx(squared, rel=1e-12)
        known = [(c - s) * m for c, s, m in zip(chosen.tolist(), sampler[i].tolist(), mask[i].tolist())
                 if not math.isnan(s)]                                          # unknown mu: ratio 1
        assert got[i, 1].item() == pytest.approx(sum(known), abs=1e-12)


def test_score_norms_of_an_episode_sum_over_its_trained_tokens_only():
    """A multi-turn episode's environment tokens (sampled 0) are in no score under env_mask=masked, as in
    the loss; under unmasked they are, as in that run's loss."""
    from grpo_ablate.tricks import option

    model = TinyLM().double()
    ids = torch.tensor([[5, 1, 2, 3], [5, 4, 6, 0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    sampled = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])          # row 0's second token: the tool's
    roll = Rollout(ids, torch.ones_like(ids), 1, mask, torch.zeros(2, dtype=torch.bool), sampled=sampled)
    single = Rollout(ids, torch.ones_like(ids), 1, mask * sampled, torch.zeros(2, dtype=torch.bool))
    masked = score_norms(model, roll, 1.0, remove_padding=False, trained=option("env_mask", "masked").impl)
    torch.testing.assert_close(masked, score_norms(model, single, 1.0, remove_padding=False), rtol=0, atol=0)
    unmasked = score_norms(model, roll, 1.0, remove_padding=False, trained=option("env_mask", "unmasked").impl)
    torch.testing.assert_close(unmasked, score_norms(model, roll, 1.0, remove_padding=False), rtol=0, atol=0)
    assert masked[0, 0] != unmasked[0, 0] and masked[1, 0] == unmasked[1, 0]


def test_score_norms_leave_the_optimizers_gradients_alone():
    model = TinyLM().double()
    ids = torch.tensor([[5, 1, 2]])
    roll = Rollout(ids, torch.ones_like(ids), 1, torch.ones(1, 2), torch.zeros(1, dtype=torch.bool))
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.25)
    score_norms(model, roll, 1.0, remove_padding=False)
    assert all(bool((p.grad == 0.25).all()) for p in model.parameters())


def test_opob_trains_and_its_weights_vary(small, tmp_path):
    overrides = small + ["steps=2", "+trick=vcpo_opob"]
    train(compose(overrides), tmp_path / "run", overrides)
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")[1:]
    assert len(rows) == 2 and all(r["loss"] is not None and math.isfinite(r["loss"]) for r in rows)
    assert all(r["adv/score_norm"] > 0 for r in rows) and any(r["adv/score_norm_cv"] > 0 for r in rows)


def test_opob_refuses_the_gradient_diagnostics_and_fsdp():
    with pytest.raises(ConfigError, match="adv=opob reads each trajectory's score-gradient norm"):
        validate(compose(["adv=opob", "diag.grad_conflict=true"]))
    with pytest.raises(ConfigError, match="which model.fsdp=true shards"):
        validate(compose(["adv=opob", "model.fsdp=true"]))


@pytest.mark.parametrize("overrides, needle", [("adv=opob adv.is_weights=2", "adv.is_weights"),
                                               ("adv=opob adv.eps=0", "adv.eps")])
def test_a_bad_opob_knob_is_one_line_exit_2_and_no_run_dir(tmp_path, overrides, needle):
    refused_train(overrides, needle, tmp_path)
