"""The policy losses DRO, rollout IS and IPO against their references, value
and gradient in float64. The expected numbers are worked by hand (plain floats) from: verl docs/algo/dro.md and its loss
(commit ea53291385ce764019a2b40733605f21d8317583, PR #7245), SkyRL skyrl/backends/skyrl_train/
utils/ppo_utils.py `rollout_is_policy_loss` (a9564572eb8e91076be43c1bd5e4615e3de17265), prime-rl
src/prime_rl/trainer/rl/loss.py `ipo_loss_fn` (559b44772e471d1538537b8805cc77f3824a5e64)."""
import math

import pytest
import torch

from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.tricks import option

D = torch.float64
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
OLD = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]], dtype=D)
DELTA = [[0.10, -0.05, 0.30], [-0.30, 0.10, 0.90]]          # log pi - log pi_old
ADV = torch.tensor([[1.0], [-2.0]], dtype=D)


def current():
    return (OLD + torch.tensor(DELTA, dtype=D)).requires_grad_(True)


def impl(name):
    return option("clip", name).impl


def test_dro_value_and_gradient_are_verls():
    logp = current()
    loss, _ = impl("dro")(logp, OLD, ADV, MASK, beta=0.5)
    a = [1.0, -2.0]
    for i in range(2):
        for t in range(3):
            lp = OLD[i, t].item() + DELTA[i][t]
            expected = -(a[i] * lp - 0.25 * DELTA[i][t] ** 2)
            assert loss[i, t].item() == pytest.approx(expected, abs=1e-12)
    (loss * MASK).sum().backward()
    expected_grad = [[(-a[i] + 0.5 * DELTA[i][t]) * MASK[i, t].item() for t in range(3)] for i in range(2)]
    torch.testing.assert_close(logp.grad, torch.tensor(expected_grad, dtype=D))


def test_dro_on_policy_is_reinforce():
    logp = OLD.clone().requires_grad_(True)
    loss, stats = impl("dro")(logp, OLD, ADV, MASK)
    (loss * MASK).sum().backward()
    torch.testing.assert_close(logp.grad, (-ADV * MASK).expand_as(MASK))
    assert stats["clip/high_frac"].sum() == 0 and stats["clip/low_frac"].sum() == 0


def test_rollout_is_zeroes_the_weight_outside_the_band_and_carries_no_gradient_through_it():
    logp = current()
    loss, stats = impl("rollout_is")(logp, OLD, ADV, MASK, eps_low=0.2, eps_high=0.2)
    # r = e^Delta: 1.105 in, 0.951 in, 1.350 out (>= 1.2), 0.741 out (<= 0.8), 1.105 in
    weights = [[math.exp(0.10), math.exp(-0.05), 0.0], [0.0, math.exp(0.10), 0.0]]
    a = [1.0, -2.0]
    for i in range(2):
        for t in range(2 if i else 3):
            lp = OLD[i, t].item() + DELTA[i][t]
            assert loss[i, t].item() == pytest.approx(-weights[i][t] * a[i] * lp, abs=1e-12)
    (loss * MASK).sum().backward()
    expected_grad = [[-weights[i][t] * a[i] * MASK[i, t].item() for t in range(3)] for i in range(2)]
    torch.testing.assert_close(logp.grad, torch.tensor(expected_grad, dtype=D))
    assert stats["clip/high_frac"][0].tolist() == [0.0, 0.0, 1.0] and stats["clip/low_frac"][1, 0] == 1.0


def test_ipo_symmetric_mask_ignores_the_advantage_sign():
    # prime-rl ipo_loss_fn: masked where |pi - mu| > 0.1, loss -keep A rho + kl_tau (log rho)^2
    old = torch.tensor([[-0.5, -0.5], [-0.5, -0.5]], dtype=D)
    logp = torch.tensor([[-0.2, -0.6], [-0.2, -0.6]], dtype=D, requires_grad=True)
    adv = torch.tensor([[1.0], [-1.0]], dtype=D)
    mask = torch.ones(2, 2, dtype=D)
    d_up = math.exp(-0.2) - math.exp(-0.5)          # 0.212 > 0.1: masked on both rows
    d_down = math.exp(-0.6) - math.exp(-0.5)        # -0.058: kept
    assert d_up > 0.1 and abs(d_down) < 0.1
    loss, stats = impl("dppo")(logp, old, adv, mask, divergence="symmetric_tv", delta_low=0.1, delta_high=0.1,
                               kl_tau=1e-3)
    r_down = math.exp(-0.1)
    expected = [[1e-3 * 0.09, -r_down + 1e-3 * 0.01], [1e-3 * 0.09, r_down + 1e-3 * 0.01]]
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=D))
    loss.sum().backward()
    # d/dlogp: -keep A rho + 2 kl_tau log rho
    grad = [[2e-3 * 0.3, -r_down - 2e-3 * 0.1], [2e-3 * 0.3, r_down - 2e-3 * 0.1]]
    torch.testing.assert_close(logp.grad, torch.tensor(grad, dtype=D))
    # binary_tv keeps the A < 0 row's upward move: the trust region looks at A's direction there
    loss_tv, _ = impl("dppo")(logp.detach(), old, adv, mask, delta_low=0.1, delta_high=0.1)
    assert loss_tv[1, 0].item() == pytest.approx(math.exp(0.3))
    assert stats["clip/high_frac"][:, 0].tolist() == [1.0, 1.0]


def test_named_tricks_of_the_new_losses_compose():
    for trick, chosen in (("dro_loss", "dro"), ("rollout_is_loss", "rollout_is"), ("ipo_loss", "dppo")):
        cfg = compose([f"+trick={trick}"])
        validate(cfg)
        assert cfg.clip.name == chosen
    assert compose(["+trick=ipo_loss"]).clip.divergence == "symmetric_tv"


@pytest.mark.parametrize("overrides, message", [
    (["clip=dro", "clip.beta=0"], "clip.beta=0 is not allowed"),
    (["clip=rollout_is", "clip.eps_low=-0.1"], "clip.eps_low=-0.1 is not allowed"),
    (["clip=dppo", "clip.divergence=ipo"], "clip.divergence='ipo' is not allowed"),
])
def test_bad_settings_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(overrides))
