"""Flexible GAE lambda (AReaL 74c633476, #1600: areal/trainer/ppo/gae.py and lambda_fn.py): a lambda per
completion from its length (VAPO's 1 - 1/(alpha L), arXiv 2504.05118; relative-position q^(1/(L-1))) and
GAE over turns, as knobs of adv=gae. Hand vectors in float64, worked from AReaL's
`vapo_length_adaptive_gae`, `relative_position_gae_lambda` and `_compute_turn_level_gae`."""
import math

import pytest
import torch

from conftest import cli_here
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.tricks import option
from grpo_ablate.tricks.adv.critic import (critic_returns, flexible_gae, gae, sample_lambda, token_rewards,
                                           turn_gae)
from test_faults import refused

D = torch.float64


def lengths_mask(*lengths, width=None):
    width = width or max(lengths)
    return torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths], dtype=D)


def test_vapo_lambda_by_hand():
    mask = lengths_mask(3, 25, 0, 40)
    # alpha 0.05 (VAPO's): 1 - 1/0.15 < 0 -> 0; 1 - 1/1.25 = 0.2; empty -> 0; 1 - 1/2 = 0.5
    torch.testing.assert_close(sample_lambda(mask, lam_fn="vapo", alpha=0.05),
                               torch.tensor([0.0, 0.2, 0.0, 0.5], dtype=D))
    torch.testing.assert_close(sample_lambda(mask, lam_fn="vapo", alpha=1.0),
                               torch.tensor([2 / 3, 1 - 1 / 25, 0.0, 1 - 1 / 40], dtype=D))
    assert sample_lambda(mask, lam_fn="vapo", alpha=1.0).dtype == D


def test_relative_position_lambda_by_hand():
    mask = lengths_mask(1, 3, 0, 5)
    torch.testing.assert_close(sample_lambda(mask, lam_fn="relative_position", q=0.5),
                               torch.tensor([1.0, 0.5 ** 0.5, 0.0, 0.5 ** 0.25], dtype=D))
    # AReaL's invariant: with gamma = 1, a terminal reward keeps q at the first step for every length
    lam = sample_lambda(mask, lam_fn="relative_position", q=0.5)
    for length, lam_i in ((3, lam[1]), (5, lam[3])):
        assert lam_i.item() ** (length - 1) == pytest.approx(0.5, abs=1e-12)


def test_constant_lambda_is_the_float_lam():
    assert sample_lambda(lengths_mask(3, 2), lam=0.95) == 0.95


# two rows of 3 and 2 trained tokens; alpha 1 -> lambda 1 - 1/3 = 2/3 and 1 - 1/2 = 1/2; gamma 0.9
MASK = lengths_mask(3, 2)
REWARDS = torch.tensor([1.0, 2.0], dtype=D)
VALUES = torch.tensor([[0.5, 0.25, 0.75], [0.1, -0.2, 9.0]], dtype=D)


def test_the_recurrence_with_a_lambda_per_sample_by_hand():
    adv, ret = flexible_gae(token_rewards(REWARDS, MASK), VALUES, MASK, gamma=0.9, lam_fn="vapo", alpha=1.0)
    # row 0: delta = [0 + 0.9*0.25 - 0.5, 0 + 0.9*0.75 - 0.25, 1 - 0.75] = [-0.275, 0.425, 0.25]
    #        A_2 = 0.25, A_1 = 0.425 + 0.9*(2/3)*0.25 = 0.575, A_0 = -0.275 + 0.6*0.575 = 0.07
    # row 1: delta = [0 + 0.9*(-0.2) - 0.1, 2 + 0.2] = [-0.28, 2.2]; A_1 = 2.2, A_0 = -0.28 + 0.45*2.2 = 0.71
    want = torch.tensor([[0.07, 0.575, 0.25], [0.71, 2.2, 0.0]], dtype=D)
    torch.testing.assert_close(adv, want)
    torch.testing.assert_close(ret, torch.tensor([[0.57, 0.825, 1.0], [0.81, 2.0, 0.0]], dtype=D))
    # each row is plain GAE with its own scalar lambda
    for i, lam in ((0, 2 / 3), (1, 0.5)):
        row, _ = gae(token_rewards(REWARDS, MASK)[i:i + 1], VALUES[i:i + 1], MASK[i:i + 1], 0.9, lam)
        torch.testing.assert_close(adv[i:i + 1], row)


def test_vapo_at_alpha_005_on_short_rows_is_td0():
    # lambda 0 below 20 tokens: A_t = r_t + gamma V_{t+1} - V_t, each token's own TD error
    adv, _ = flexible_gae(token_rewards(REWARDS, MASK), VALUES, MASK, gamma=0.9, lam_fn="vapo", alpha=0.05)
    torch.testing.assert_close(adv, torch.tensor([[-0.275, 0.425, 0.25], [-0.28, 2.2, 0.0]], dtype=D))


def test_turn_level_gae_with_one_turn_a_row_by_hand():
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=D)
    rewards = torch.tensor([1.0, 2.0, 5.0], dtype=D)
    values = torch.tensor([[0.5, 0.25, 0.75], [0.1, -0.2, 9.0], [3.0, 3.0, 3.0]], dtype=D)
    adv, ret = turn_gae(token_rewards(rewards, mask), values, mask)
    # one timestep: A = R - V(first trained token), broadcast; the critic's target A + V = R; an empty row 0
    torch.testing.assert_close(adv, torch.tensor([[0.5] * 3, [1.9, 1.9, 0.0], [0.0] * 3], dtype=D))
    torch.testing.assert_close(ret, torch.tensor([[1.0] * 3, [2.0, 2.0, 0.0], [0.0] * 3], dtype=D))
    # gamma and lambda act between turns: with one turn a row they change nothing
    for kw in ({"gamma": 0.5, "lam": 0.3}, {"gamma": 1.0, "lam": 1.0}):
        a2, r2 = flexible_gae(token_rewards(rewards, mask), values, mask, timestep="turn", **kw)
        torch.testing.assert_close((a2, r2), (adv, ret))
    # against token-level GAE at gamma = lambda = 1 (A_t = R - V_t): only the first token agrees
    tok, _ = gae(token_rewards(rewards, mask), values, mask, 1.0, 1.0)
    torch.testing.assert_close(tok[:, 0], adv[:, 0])
    assert not torch.allclose(tok, adv)


def test_the_estimator_whitens_the_per_sample_lambdas_advantages():
    a = option("adv", "gae").bind({"lam_fn": "vapo", "alpha": 1.0, "gamma": 0.9})(REWARDS, None, MASK, VALUES, {})
    raw, _ = flexible_gae(token_rewards(REWARDS, MASK), VALUES, MASK, gamma=0.9, lam_fn="vapo", alpha=1.0)
    n = MASK.sum()
    mean = (raw * MASK).sum() / n
    std = math.sqrt(((((raw - mean) * MASK) ** 2).sum() / n).item() + 1e-8)
    torch.testing.assert_close(a, (raw - mean) / std * MASK)


def test_the_critics_targets_use_the_same_lambda():
    ret = critic_returns(REWARDS, MASK, VALUES, gamma=0.9, lam=1.0, whiten=True, lam_fn="vapo", alpha=1.0)
    torch.testing.assert_close(ret, torch.tensor([[0.57, 0.825, 1.0], [0.81, 2.0, 0.0]], dtype=D))
    # adv=gae's own knobs: the targets are the scalar-lambda GAE's, as before the knobs existed
    torch.testing.assert_close(critic_returns(REWARDS, MASK, VALUES, gamma=0.9, lam=0.5, whiten=True),
                               gae(token_rewards(REWARDS, MASK), VALUES, MASK, 0.9, 0.5)[1])


def test_the_knobs_are_listed_and_every_recorded_hash_is_unchanged(monkeypatch):
    """The λ knobs are listed in adv=gae's config at the plain GAE they reduce to, and hashed only away
    from it (allowed.py's neutral; alpha and q only under the lam_fn that reads them): every adv=gae
    config recorded before they were listed hashes as it did, and the `+adv.lam_fn=…` that added them
    then still composes, to the same config as `adv.lam_fn=…`."""
    import json
    from pathlib import Path

    from grpo_ablate.config.identity import config_hash

    assert option("adv", "gae").config() == {"name": "gae", "gamma": 1.0, "lam": 1.0, "whiten": True,
                                             "lam_fn": "constant", "alpha": 0.05, "q": 0.5, "timestep": "token",
                                             "value_coef": 0.5}
    monkeypatch.delenv("GRPO_ABLATE_CACHE", raising=False)   # model.cache_dir as recorded: its default
    recorded = json.loads((Path(__file__).parent / "data" / "composed_configs.json").read_text())
    for case in ("adv=gae", "+trick=critic_gae", "+trick=vapo_gae"):
        assert config_hash(compose([case])) == recorded[case][0], case
    cfg = compose(["+trick=vapo_gae"])
    assert cfg.adv.name == "gae" and cfg.adv.lam_fn == "vapo" and cfg.adv.alpha == 0.05
    validate(cfg)
    added, listed = compose(["adv=gae", "+adv.lam_fn=vapo"]), compose(["adv=gae", "adv.lam_fn=vapo"])
    assert added == listed and added.adv.lam_fn == "vapo"


@pytest.mark.parametrize("overrides, needle", [
    (["adv=gae", "+adv.timestep=turn", "kl=in_reward"], "adv.timestep=turn keeps the KL out of the turn recurrence"),
    (["adv=gae", "+adv.timestep=turn", "+adv.lam_fn=vapo"], "adv.lam_fn=vapo does nothing with adv.timestep=turn"),
    (["adv=gae", "+adv.alpha=0"], "adv.alpha=0"),
    (["adv=gae", "+adv.q=0"], "adv.q=0"),
    (["adv=gae", "+adv.q=1.5"], "adv.q=1.5"),
    (["adv=gae", "+adv.lam_fn=nope"], "adv.lam_fn='nope' is not allowed; allowed: constant, vapo, relative_position"),
    (["adv=gae", "+adv.timestep=episode"], "adv.timestep='episode' is not allowed; allowed: token, turn"),
])
def test_bad_values_are_refused(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("+", r"\+")):
        validate(compose(overrides))


def test_turn_level_with_the_kl_in_the_loss_is_allowed():
    validate(compose(["adv=gae", "+adv.timestep=turn", "kl=fixed"]))
    validate(compose(["adv=gae", "+adv.timestep=turn"]))


def test_the_refusal_is_one_line_through_the_cli(tmp_path):
    refused(cli_here("train", "adv=gae", "+adv.timestep=turn", "kl=in_reward", cwd=tmp_path),
            "use kl=fixed (the KL in the loss)")
