"""prime-rl's hierarchical GRPO (algo.type=hierarchical_grpo, 0b583306e, #3138, on the algorithm
classes of 0be5ac452, #2746) as adv=hierarchical_grpo: the comparison groups and their baselines
against hand vectors worked from prime-rl's `HierarchicalGRPOAlgorithm.score_group`, in float64; the
episode split of this trainer's groups, the activity metric, the inert rule and the refusal."""
import pytest
import torch

from conftest import refused_train
from grpo_ablate.config.compose import compose
from grpo_ablate.config.inert import inert_reason
from grpo_ablate.tricks.adv.group import comparison_groups, episode_gap, episode_index, peer_centred
from grpo_ablate.tricks.registry import option

D = torch.float64


def test_the_docs_example_three_solvers_on_one_problem():
    # prime-rl docs/algorithms.md: solver rewards [1, 1, 0] on one proposed problem -> [1/3, 1/3, -2/3]
    keys = comparison_groups(["solver"] * 3, [7, 7, 7], [0, 0, 0], ["solver"])
    torch.testing.assert_close(peer_centred(torch.tensor([1.0, 1.0, 0.0], dtype=D), keys),
                               torch.tensor([1 / 3, 1 / 3, -2 / 3], dtype=D))


def test_proposers_are_compared_across_the_group_and_solvers_within_their_episode():
    # one source task (rollout group 0), two proposed problems (episodes a, b), each with a proposer
    # trace and two solver attempts; a second source task (group 1) with one lone proposal.
    roles = ["proposer", "solver", "solver", "proposer", "solver", "solver", "proposer", "solver", "solver"]
    episodes = ["a", "a", "a", "b", "b", "b", "c", "c", "c"]
    groups = [0, 0, 0, 0, 0, 0, 1, 1, 1]
    rewards = torch.tensor([0.5, 1.0, 0.0, 0.25, 1.0, 1.0, 0.75, 1.0, 0.0], dtype=D)
    keys = comparison_groups(roles, episodes, groups, ["solver"])
    # peers: proposers of group 0 (mean .375), solvers of a (.5), solvers of b (1), the lone proposer
    # of group 1 (itself: 0), solvers of c (.5)
    assert keys.tolist() == [0, 1, 1, 0, 2, 2, 3, 4, 4]
    torch.testing.assert_close(peer_centred(rewards, keys),
                               torch.tensor([0.125, 0.5, -0.5, -0.125, 0.0, 0.0, 0.0, 0.5, -0.5], dtype=D))
    # a role not in episode_agents is compared across the group: with none scoped, every role's group mean
    flat = comparison_groups(roles, episodes, groups, [])
    assert flat.tolist() == [0, 1, 1, 0, 1, 1, 2, 3, 3]


def test_the_option_takes_each_groups_completions_episode_size_at_a_time():
    hier = option("adv", "hierarchical_grpo").impl
    # a group of 5 (ragged: its last episode is one row) and a group of 3, rows interleaved
    groups = torch.tensor([0, 1, 0, 0, 1, 0, 1, 0])
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0], dtype=D)
    # group 0's rows in order: 0, 2, 3, 5, 7 -> episodes {0, 2}, {3, 5}, {7}; group 1's: 1, 4, 6 -> {1, 4}, {6}
    assert episode_index(groups, 2).tolist() == [0, 3, 0, 1, 3, 1, 4, 2]
    expected = torch.tensor([0.5, 0.5, -0.5, 0.0, -0.5, 0.0, 0.0, 0.0], dtype=D)   # lone rows 6, 7: 0
    torch.testing.assert_close(hier(rewards, groups, None, None, {}, episode_size=2), expected)
    # an episode as large as the group is the group: adv=dr_grpo
    dr = option("adv", "dr_grpo").impl(rewards, groups, None, None, {})
    torch.testing.assert_close(hier(rewards, groups, None, None, {}, episode_size=5), dr)
    # the activity metric: mean over rows of |episode mean - group mean| (group means .8 and 1/3)
    gaps = [0.3, 1 / 6, 0.3, 0.2, 1 / 6, 0.2, 1 / 3, 0.2]
    assert episode_gap(rewards, groups, 2) == pytest.approx(sum(gaps) / 8, abs=1e-12)
    assert episode_gap(rewards, groups, 5) == 0.0


def test_the_episode_gap_plugin_reports_the_rewards_the_estimator_saw():
    from types import SimpleNamespace

    from grpo_ablate.train.state.adv import EpisodeGap
    plugin = EpisodeGap(2)
    plugin.after_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float32))
    batch = SimpleNamespace(group_index=torch.tensor([0, 0, 0, 0]))
    # group mean .75; episodes {1, 0} (.5) and {1, 1} (1): |.5 - .75| = |1 - .75| = .25
    assert plugin.metrics(batch) == {"adv/episode_gap": pytest.approx(0.25)}


def test_inert_when_one_episode_holds_the_whole_group():
    reason = inert_reason(compose(["adv=hierarchical_grpo", "rollout.group_size=4"]), "adv", "hierarchical_grpo")
    assert reason is not None and "adv.episode_size" in reason and ": " in reason
    assert inert_reason(compose(["adv=hierarchical_grpo"]), "adv", "hierarchical_grpo") is None   # 4 of 8


def test_an_episode_of_one_is_refused(tmp_path):
    # an episode of one completion is its own baseline: every advantage 0, nothing would train
    refused_train("adv=hierarchical_grpo adv.episode_size=1", "adv.episode_size", tmp_path)
