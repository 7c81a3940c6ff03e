"""What happens at a truncated turn of a multi-turn episode (family `overlong`, reading the episode's
`truncated` flag): the reward kept (`none`), scaled to zero (`stop_properly`), or the whole episode,
its environment tokens too, masked out of the loss (`filter`). Hand vectors in float64."""
from types import SimpleNamespace

import pytest
import torch

from grpo_ablate.config.compose import compose
from grpo_ablate.config.inert import inert_reason
from grpo_ablate.config.spec import run_spec
from grpo_ablate.train.rewards import RewardShaping
from grpo_ablate.tricks import option
from grpo_ablate.tricks.loss_agg import aggregate

D = torch.float64
# three episodes of one group, 6 token slots:
#   row 0  policy, policy, reply, reply, policy (EOS)      ended properly
#   row 1  policy, policy, reply, reply, policy, policy    its second turn cut by the per-turn budget
#   row 2  policy, policy, policy                          its first turn cut: no reply
COMPLETION = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=D)
SAMPLED = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=D)
TRUNCATED = torch.tensor([False, True, True])
SCORES = torch.tensor([1.0, 1.0, 0.0], dtype=D)    # an environment may score a cut episode (partial credit)
GROUP = torch.tensor([0, 0, 0])


def shaped(*overrides):
    spec = run_spec(compose(["task=calculator", *overrides]))
    roll = SimpleNamespace(completion_mask=COMPLETION, sampled=SAMPLED, truncated=TRUNCATED)
    shaping = RewardShaping(spec.tricks, spec.reward, spec.rollout.max_new_tokens, SimpleNamespace(), reward_beta=0)
    return shaping(SCORES, ["", "", ""], roll, GROUP)


def test_the_stop_properly_penalty_scales_a_truncated_reward_by_hand():
    rewards = torch.tensor([1.0, 0.5, -1.0, 0.8], dtype=D)
    truncated = torch.tensor([False, True, True, True])
    fn = option("overlong", "stop_properly").bind({"coef": 0.25})
    got, keep, penalty = fn(rewards, torch.ones(4, dtype=D), truncated, torch.zeros(4, dtype=torch.long),
                            torch.ones(4, dtype=torch.bool), 8)
    # NeMo-RL apply_reward_shaping: R' = coef R where truncated, R elsewhere
    torch.testing.assert_close(got, torch.tensor([1.0, 0.125, -0.25, 0.2], dtype=D), rtol=0, atol=1e-15)
    torch.testing.assert_close(penalty, torch.tensor([0.0, -0.375, 0.75, -0.6], dtype=D), rtol=0, atol=1e-15)
    assert keep.all()


@pytest.mark.parametrize("overrides, rewards, penalty", [
    ([], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]),                                    # default: the reward is kept
    (["overlong=stop_properly"], [1.0, 0.0, 0.0], [0.0, -1.0, 0.0]),           # a cut episode scores zero
    (["overlong=stop_properly", "overlong.coef=0.25"], [1.0, 0.25, 0.0], [0.0, -0.75, 0.0]),
])
def test_a_truncated_episode_keeps_or_loses_its_reward_and_trains_its_policy_tokens(overrides, rewards, penalty):
    out = shaped(*overrides)
    torch.testing.assert_close(out.rewards, torch.tensor(rewards, dtype=D), rtol=0, atol=1e-15)
    torch.testing.assert_close(out.components["overlong_reward"], torch.tensor(penalty, dtype=D), rtol=0, atol=1e-15)
    assert torch.equal(out.mask, COMPLETION * SAMPLED)                         # the policy's tokens, every row


def test_filtering_masks_the_whole_truncated_episode_out_of_every_loss_term():
    out = shaped("overlong=filter")
    assert out.keep.tolist() == [True, False, False] and out.rewards.tolist() == [1.0, 1.0, 0.0]
    assert torch.equal(out.mask, torch.tensor([[1, 1, 0, 0, 1, 0]] + [[0] * 6] * 2, dtype=D))
    # token_mean by hand: L = -sum_t m_t A_i r_t / sum_t m_t over the one kept episode's 3 policy tokens
    advantage = torch.tensor([[0.5], [2.0], [-1.0]], dtype=D)
    logp = torch.tensor([[-0.3, -1.2, -2.0, -0.7, -0.1, -5.0]] * 3, dtype=D, requires_grad=True)
    weights = option("loss_agg", "token_mean").impl(out.mask, 6, GROUP)
    loss = aggregate(-advantage * torch.exp(logp - logp.detach()), weights)
    loss.backward()
    assert loss.item() == pytest.approx(-0.5, abs=1e-15)
    expected = torch.zeros(3, 6, dtype=D)
    expected[0, [0, 1, 4]] = -0.5 / 3
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-15)


def test_the_stop_properly_penalty_is_inert_at_coef_1():
    assert inert_reason(compose(["overlong=stop_properly", "overlong.coef=1"]), "overlong", "stop_properly")
    assert not inert_reason(compose(["overlong=stop_properly"]), "overlong", "stop_properly")
