"""Family `adv`, the advantages maxrl and remax against their references, in float64: every expected
value is worked by hand from the reference's source named in each test (SkyRL, verl)."""
import torch

from grpo_ablate.tricks import option

D = torch.float64


def test_maxrl_advantage_is_skyrls():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0], dtype=D)
    group_index = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3])
    got = option("adv", "maxrl").impl(rewards, group_index, None, None, {})
    # SkyRL compute_maxrl_advantage: (r - mean) / (mean + 1e-6); a group of one: r - 0
    expected = [(1 - 0.25) / (0.25 + 1e-6)] + [-0.25 / (0.25 + 1e-6)] * 3 \
        + [0.25 / (0.75 + 1e-6)] * 3 + [-0.75 / (0.75 + 1e-6)] + [0.0, 0.0] + [1.0]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=D))


def test_remax_subtracts_the_greedy_reward_as_verl():
    # verl compute_remax_outcome_advantage: reward-to-go of the outcome reward (r on every token) - baseline
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=D)
    greedy = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=D)        # per row: its prompt's greedy reward
    got = option("adv", "remax").impl(rewards, torch.tensor([0, 0, 1, 1]), None, greedy, {})
    assert got.tolist() == [0.0, -1.0, 1.0, 0.0]
    assert option("adv", "remax").greedy_baseline
