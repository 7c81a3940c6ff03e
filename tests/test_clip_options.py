"""Family `clip`, the policy losses dppo, vespo, luspo, topr, kimi15 and clamped REINFORCE against their
references, in float64.

None of the references is installed here (SkyRL, prime-rl, ROLL, PipelineRL are not pip
packages of this project; TRL is an optional extra), so every expected value is worked by
hand, in plain Python floats, from the reference's source named in each test.
"""
import math

import pytest
import torch

from grpo_ablate.tricks import option

D = torch.float64
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
OLD = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]], dtype=D)
DELTA = [[0.40, -0.05, 0.20], [-0.30, 0.10, 0.50]]          # log pi - log pi_old (the last is padding)
ADV = torch.tensor([[1.0], [-2.0]], dtype=D)


def impl(name):
    return option("clip", name).impl


def current():
    return (OLD + torch.tensor(DELTA, dtype=D)).requires_grad_(True)


def tokens():
    """(row, t, A, log pi_old, Delta) of every token, padding included."""
    for i in range(2):
        for t in range(3):
            yield i, t, float(ADV[i, 0]), float(OLD[i, t]), DELTA[i][t]


def test_dppo_binary_tv_masks_by_probability_difference_as_skyrl():
    # SkyRL dppo_policy_loss (binary_tv): mask (A > 0, pi - mu > 0.2) and (A < 0, mu - pi > 0.2); -rho A mask
    logp = current()
    loss, stats = impl("dppo")(logp, OLD, ADV, MASK, delta_low=0.2, delta_high=0.2)
    for i, t, a, old, d in tokens():
        moved = math.exp(old + d) - math.exp(old)
        keep = not ((a > 0 and moved > 0.2) or (a < 0 and -moved > 0.2))
        assert loss[i, t].item() == pytest.approx(-math.exp(d) * a * keep)
    # token (0, 0): pi 0.549 - mu 0.368 = 0.18 stays; token (0, 1): a drop; row 1 token 0: mu - pi 0.19 stays
    assert stats["clip/high_frac"].sum() == 0
    lower = impl("dppo")(logp, OLD, ADV, MASK, delta_low=0.2, delta_high=0.1)[1]["clip/high_frac"]
    assert lower[0].tolist() == [1.0, 0.0, 0.0]                         # 0.18 > 0.1: masked


def test_dppo_binary_kl_and_prime_rl_kl_tau():
    logp = current()
    loss, _ = impl("dppo")(logp, OLD, ADV, MASK, divergence="binary_kl", delta_low=0.01, delta_high=0.01,
                           kl_tau=1e-3)
    for i, t, a, old, d in tokens():
        pi, mu = math.exp(old + d), math.exp(old)
        # SkyRL binary_kl (eq. 14): mu log(mu/pi) + (1 - mu) log((1 - mu + 1e-8) / (1 - pi + 1e-8))
        kl = mu * (old - (old + d)) + (1 - mu) * math.log((1 - mu + 1e-8) / (1 - pi + 1e-8))
        masked = (a > 0 and pi > mu and kl > 0.01) or (a < 0 and pi < mu and kl > 0.01)
        # prime-rl default_loss_fn: -keep rho A + kl_tau (log rho)^2
        assert loss[i, t].item() == pytest.approx(-math.exp(d) * a * (not masked) + 1e-3 * d * d)


def test_vespo_is_trls_gamma_weighted_reinforce():
    logp = current()
    loss, stats = impl("vespo")(logp, OLD, ADV, MASK)
    for i in range(2):
        a = float(ADV[i, 0])
        log_w = sum(DELTA[i][t] for t in range(3) if MASK[i, t] > 0)    # TRL: a sum of log-ratios
        k, lam = (2.0, 3.0) if a >= 0 else (3.0, 2.0)                   # TRL vespo defaults by the sign of A
        phi = math.exp(lam + k * log_w - lam * math.exp(log_w))
        for t in range(3):
            assert loss[i, t].item() == pytest.approx(-phi * a * (float(OLD[i, t]) + DELTA[i][t]))
            assert stats["vespo/phi_dev"][i, t].item() == pytest.approx(abs(phi - 1))
    on_policy, stats = impl("vespo")(OLD.clone(), OLD, ADV, MASK)
    assert stats["vespo/phi_dev"].abs().max() == 0                      # phi(1) = 1


def test_luspo_is_gspo_times_length_and_matches_trls_mean():
    logp = current()
    loss, _ = impl("luspo")(logp, OLD, ADV, MASK, eps_low=0.2, eps_high=0.2)
    # TRL luspo: per-sequence -min(s A, clip(s) A) (s = exp(mean Delta)), times mask.sum(1), mean over B
    expected = 0.0
    for i, n in ((0, 3), (1, 2)):
        s = math.exp(sum(DELTA[i][:n]) / n)
        a = float(ADV[i, 0])
        expected += -min(s * a, min(max(s, 0.8), 1.2) * a) * n / 2
    seq_mean_token_mean = ((loss * MASK).sum(1) / MASK.sum(1)).mean()
    assert seq_mean_token_mean.item() == pytest.approx(expected)


def test_topr_is_rolls_tapered_reinforce():
    logp = current()
    loss, stats = impl("topr")(logp, OLD, ADV, MASK)
    for i, t, a, old, d in tokens():
        # ROLL _compute_topr_loss: positive -A log pi; negative -clamp(rho, 0, 1) A log pi
        weight = 1.0 if a > 0 else min(max(math.exp(d), 0.0), 1.0)
        assert loss[i, t].item() == pytest.approx(-weight * a * (old + d))
    assert stats["clip/high_frac"][1].tolist() == [0.0, 1.0, 1.0]       # negative row, rho > 1 capped
    (loss * MASK).sum().backward()
    # the weight carries no gradient: d loss / d log pi = -w A
    assert logp.grad[1, 1].item() == pytest.approx(-1.0 * -2.0)


def test_kimi15_is_rolls_squared_log_ratio_loss():
    logp = current()
    loss, _ = impl("kimi15")(logp, OLD, ADV, MASK, tau=0.1)
    for i, t, a, old, d in tokens():
        # ROLL _compute_kimi15_loss: -A log pi + tau/2 (log pi - log pi_old)^2
        assert loss[i, t].item() == pytest.approx(-a * (old + d) + 0.05 * d * d)


def test_clamped_reinforce_is_pipelinerls():
    logp = current()
    loss, stats = impl("clamped_reinforce")(logp, OLD, ADV, MASK, eps_high=0.2)
    for i, t, a, old, d in tokens():
        # PipelineRL rl_step "reinforce": new_logprobs * A * clamp(ratio, 0, 1 + eps_high).detach()
        assert loss[i, t].item() == pytest.approx(-min(math.exp(d), 1.2) * a * (old + d))
    assert stats["clip/high_frac"][0].tolist() == [1.0, 0.0, 1.0]       # e^0.4, e^0.2 > 1.2


@pytest.mark.parametrize("name", ["dppo", "vespo", "topr", "kimi15", "clamped_reinforce"])
def test_on_policy_the_gradient_is_reinforces(name):
    """off_policy_only: at rho == 1 each has plain -A grad log pi (so ONE_STEP's inert rule holds)."""
    logp = OLD.clone().requires_grad_(True)
    loss, _ = impl(name)(logp, OLD, ADV, MASK)
    (loss * MASK).sum().backward()
    torch.testing.assert_close(logp.grad, (-ADV * MASK).expand_as(MASK))
