"""Family `overlong`, PipelineRL's difficulty-aware length penalty (`soft_punish` with gamma and
failure_scale), in float64, worked by hand from PipelineRL pipelinerl/actor.py and
pipelinerl/domains/math/rollouts.py `length_penalty` (commit 58d393458625ad63ed539f2dcd072c85700c557f).
"""

import pytest
import torch

from conftest import refused_train
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.tricks import option

D = torch.float64


def test_difficulty_aware_penalty_is_pipelinerls():
    # max_tokens 8, buffer 4: length_penalty = (4 - |o|) / 4 past 4 tokens. Group 0 solves 2 of 4 (rate .5),
    # group 1 both (rate 1), one of them truncated (the hard cap guard keeps its full penalty)
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0], dtype=D)
    lengths = torch.tensor([7, 6, 7, 3, 8, 5])
    truncated = torch.tensor([False, False, False, False, True, False])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    correct = rewards > 0
    punish = option("overlong", "soft_punish")
    _, _, dapo = punish.bind({"buffer": 4})(rewards, lengths, truncated, groups, correct, 8)
    torch.testing.assert_close(dapo, torch.tensor([-0.75, -0.5, -0.75, 0.0, -1.0, -0.25], dtype=D))
    shaped, keep, penalty = punish.bind({"buffer": 4, "gamma": 2.0, "failure_scale": 0.5})(
        rewards, lengths, truncated, groups, correct, 8)
    # successes x .5^2 in group 0, x 1^2 in group 1 (x 1 when truncated); the failure x .5
    expected = [-0.75 * 0.25, -0.5 * 0.25, -0.75 * 0.5, 0.0, -1.0, -0.25]
    torch.testing.assert_close(penalty, torch.tensor(expected, dtype=D))
    torch.testing.assert_close(shaped, rewards + penalty)
    assert keep.all()


def test_the_named_trick_composes():
    cfg = compose(["+trick=difficulty_aware_penalty"])
    validate(cfg)
    assert (cfg.overlong.name, cfg.overlong.gamma, cfg.overlong.failure_scale) == ("soft_punish", 1.0, 1.0)


@pytest.mark.parametrize("overrides, message", [
    (["overlong=soft_punish", "overlong.gamma=1", "adv=gae", "rollout.group_size=1"], "a group of one has not"),
])
def test_bad_overlong_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(overrides))


# a bad value of each knob, as a user meets it: one `error:` line, exit 2, nothing written
@pytest.mark.parametrize("overrides, needle", [
    ("overlong=soft_punish overlong.gamma=-1", "overlong.gamma"),
    ("overlong=soft_punish overlong.failure_scale=1.5", "overlong.failure_scale"),
])
def test_a_bad_overlong_value_is_one_line_exit_2_and_no_run_dir(tmp_path, overrides, needle):
    refused_train(overrides, needle, tmp_path)
