"""CISPO's anchors and bounds: clip=cispo_rollout (SkyRL cispo.cispo_anchor=rollout, dda1cb3c8, #1859)
takes its importance ratio against the sampler's log-probs mu, not pi_old, through the trainer's loss;
the one-sided clip [0, 5] (SkyRL fdfcb4352, #1928; ScaleRL) is clip=cispo_trl's cap, the same weight
whatever the option. Hand vectors in float64, worked from SkyRL's `compute_policy_loss_cispo`."""
import math

import pytest
import torch

from conftest import cli_here
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.config.inert import inert_reason
from grpo_ablate.config.spec import run_spec
from grpo_ablate.train.losses import Coefficients, LossInputs, LossTerms
from grpo_ablate.tricks import option
from test_faults import refused

D = torch.float64
NO_TERMS = Coefficients(kl=0.0, kl_prev=0.0, entropy=0.0, value=0.0)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
ADV = torch.tensor([[1.0], [-2.0]], dtype=D)
THETA = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]], dtype=D)
# log pi - log mu per token (the last is padding): e^2 = 7.39 is above SkyRL's cap 1 + 4
LOG_RATIO = [[0.2, -0.5, 2.0], [-0.1, 1.0, 0.0]]
MU = THETA - torch.tensor(LOG_RATIO, dtype=D)


def policy_term(overrides, sampler_logp, old_logp=THETA, advantages=ADV, mask=MASK):
    """The policy term [N, T] through the trainer's LossTerms, its statistics, and the gradient of its masked sum."""
    logp = THETA.clone().requires_grad_(True)
    terms, stats = LossTerms(run_spec(compose(overrides)).tricks)(
        logp, torch.zeros_like(logp), None, LossInputs(mask, advantages, old_logp=old_logp, sampler_logp=sampler_logp),
        NO_TERMS)
    (terms["policy"] * mask).sum().backward()
    return terms["policy"].detach(), stats, logp.grad


def test_the_rollout_anchor_weighs_by_pi_over_mu_where_pi_old_gives_one():
    # one optimizer step: pi_theta is pi_old, so clip=cispo's ratio is 1 (SkyRL #1859's reason for the anchor)
    loss, stats, grad = policy_term(["clip=cispo_rollout"], MU)
    # SkyRL, cispo_anchor="rollout": ratio = exp(clamp(log pi - log rollout, -20, 20)), clamp(ratio, 1 - 1, 1 + 4)
    w = [[math.exp(0.2), math.exp(-0.5), 5.0], [math.exp(-0.1), math.exp(1.0), 1.0]]
    a, lp = [1.0, -2.0], THETA.tolist()
    torch.testing.assert_close(loss, torch.tensor([[-w[i][t] * a[i] * lp[i][t] for t in range(3)] for i in range(2)],
                                                  dtype=D), rtol=0, atol=1e-12)
    # the gradient is -w A on each trained token: none through w, and the capped token still learns (-5)
    torch.testing.assert_close(grad, torch.tensor([[-w[0][0], -w[0][1], -5.0], [2 * w[1][0], 2 * w[1][1], 0.0]],
                                                  dtype=D), rtol=0, atol=1e-12)
    assert stats["clip/high_frac"].tolist() == [[0, 0, 1], [0, 0, 0]]
    assert stats["clip/low_frac"].sum() == 0                        # eps_low 1: a lower bound of 0, never reached
    torch.testing.assert_close(stats["cispo/ratio_dev"][0], torch.tensor(
        [math.exp(0.2) - 1, 1 - math.exp(-0.5), math.exp(2.0) - 1], dtype=D), rtol=0, atol=1e-12)
    # the same inputs under clip=cispo (anchor pi_old): weight 1, plain -A
    _, old_stats, old_grad = policy_term(["clip=cispo", "clip.eps_low=1", "clip.eps_high=4"], MU)
    torch.testing.assert_close(old_grad, -ADV.expand(2, 3) * MASK, rtol=0, atol=0)
    assert old_stats["clip/high_frac"].sum() == 0


def test_skyrls_own_rollout_anchor_case():
    # SkyRL tests/train/algorithms/test_losses.py test_policy_loss_cispo_rollout_anchor (dda1cb3c8): eps 0.2 / 0.2
    logp = torch.tensor([[-1.69315, -1.0, -0.69741]], dtype=D)
    old = torch.tensor([[-1.0, -1.0, -3.0]], dtype=D)
    rollout = torch.tensor([[-1.30685, -1.5, -1.0]], dtype=D)
    adv = torch.tensor([[1.0, -1.0, -4.0]], dtype=D)
    terms, _ = LossTerms(run_spec(compose(["clip=cispo_rollout", "clip.eps_low=0.2", "clip.eps_high=0.2"])).tricks)(
        logp, torch.zeros_like(logp), None, LossInputs(torch.ones(1, 3, dtype=D), adv, old_logp=old,
                                                       sampler_logp=rollout), NO_TERMS)
    # ratios e^-0.3863 = 0.680 -> 0.8, e^0.5 = 1.649 -> 1.2, e^0.30259 = 1.353 -> 1.2
    # (against pi_old they would be e^-0.69, 1 and e^2.3)
    expected = [0.8 * 1.69315, -1.2 * 1.0, -1.2 * 4.0 * 0.69741]
    torch.testing.assert_close(terms["policy"], torch.tensor([expected], dtype=D), rtol=0, atol=1e-12)
    assert terms["policy"].sum().item() == pytest.approx(-3.193048, abs=1e-6)


def test_an_unknown_or_unrecorded_sampler_log_prob_falls_back_to_pi_old():
    # a NaN from the engine is unknown (tricks/behaviour.py): pi_old's in its place, ratio 1 there
    sampler = MU.clone()
    sampler[0, 2] = float("nan")
    loss, _, grad = policy_term(["clip=cispo_rollout"], sampler)
    assert grad[0, 2].item() == pytest.approx(-1.0) and torch.isfinite(loss).all()
    assert grad[0, 0].item() == pytest.approx(-math.exp(0.2))
    # no sampler log-probs at all (greedy sampling records none): the ratio against pi_old, clip=cispo's
    _, _, grad = policy_term(["clip=cispo_rollout"], None)
    torch.testing.assert_close(grad, -ADV.expand(2, 3) * MASK, rtol=0, atol=0)


def test_the_anchor_moves_the_policy_loss_only_and_wins_over_train_logp():
    # proximal=train_logp makes pi_old the training forward itself (rho = 1); the sampler anchor is not pi_old
    _, _, grad = policy_term(["clip=cispo_rollout", "proximal=train_logp"], MU)
    assert grad[0, 0].item() == pytest.approx(-math.exp(0.2)) and grad[0, 2].item() == pytest.approx(-5.0)
    # the KL term keeps pi_old: the same k3 with either anchor of the policy loss
    logp = THETA.clone()
    ref = THETA - 0.3
    coef = Coefficients(kl=0.1, kl_prev=0.0, entropy=0.0, value=0.0)
    kls = [LossTerms(run_spec(compose([f"clip={name}", "kl=fixed"])).tricks)(
        logp, torch.zeros_like(logp), None, LossInputs(MASK, ADV, old_logp=THETA, ref_logp=ref, sampler_logp=MU),
        coef)[0]["kl"] for name in ("cispo", "cispo_rollout")]
    torch.testing.assert_close(kls[0], kls[1], rtol=0, atol=0)


@pytest.mark.parametrize("log_ratio", [-25.0, -3.0, -0.5, 0.0, 0.3, 1.5, math.log(5.0) + 1e-9, 2.5, 30.0])
def test_the_one_sided_clip_is_cispo_trls_cap(log_ratio):
    """SkyRL's default since fdfcb4352 (eps_low 1, eps_high 4: [0, 5]), ScaleRL's clip(rho, 0, 5) and TRL's
    min(rho, 5) (clip=cispo_trl, preset=scalerl) are one weight: rho > 0, so the lower bound 0 never acts."""
    old = torch.tensor([[-1.0]], dtype=D)
    adv, mask = torch.tensor([[-1.5]], dtype=D), torch.ones(1, 1, dtype=D)
    grads, losses = [], []
    for name, knobs in (("cispo", {"eps_low": 1.0, "eps_high": 4.0}), ("cispo_trl", {"eps_max": 5.0}),
                        ("cispo_rollout", {})):
        logp = (old + log_ratio).requires_grad_(True)
        loss, _ = option("clip", name).bind(knobs)(logp, old, adv, mask)
        loss.sum().backward()
        losses.append(loss.detach())
        grads.append(logp.grad)
    w = min(math.exp(min(max(log_ratio, -20.0), 20.0)), 5.0)   # log rho clamped to [-20, 20] (SkyRL, verl)
    for loss, grad in zip(losses, grads):
        torch.testing.assert_close(grad, torch.tensor([[1.5 * w]], dtype=D), rtol=1e-15, atol=0)
        torch.testing.assert_close(loss, losses[0], rtol=0, atol=0)


@pytest.mark.parametrize("correction", [["rollout_correction=token_truncate"], ["rollout_correction=sequence_mask"],
                                        ["rollout_correction=decoupled"],
                                        ["rollout_correction=rejection", "rollout_correction.weighted=true"]])
def test_a_correction_that_weighs_by_pi_old_over_mu_again_is_refused(correction):
    with pytest.raises(ConfigError, match="the mismatch would count twice"):
        validate(compose(["clip=cispo_rollout", *correction]))


@pytest.mark.parametrize("correction", [[], ["rollout_correction=m2po"], ["rollout_correction=rejection"]])
def test_a_mask_beside_the_rollout_anchor_is_allowed(correction):
    validate(compose(["clip=cispo_rollout", *correction]))      # SkyRL refuses TIS only; masks stay
    validate(compose(["clip=cispo", "rollout_correction=token_truncate"]))   # pi_old's anchor: no double weight


def test_the_refusal_is_one_line_through_the_cli(tmp_path):
    refused(cli_here("train", "clip=cispo_rollout", "rollout_correction=token_truncate", cwd=tmp_path),
            "clip=cispo_rollout weighs each token by pi / mu already, and rollout_correction=token_truncate")


def test_the_rollout_anchor_acts_at_one_step_once_the_sampler_differs():
    # the default: one optimizer step, the sampler is the trainer -> both anchors are inert
    assert "sampler is the trainer itself" in inert_reason(compose(["clip=cispo_rollout"]), "clip", "cispo_rollout")
    # stale rollouts (or bf16 sampling) at one step: clip=cispo still cannot act, the rollout anchor can
    for acts in (["staleness=fixed"], ["rollout.dtype=bfloat16"], ["updates=mini_batches"]):
        assert inert_reason(compose(["clip=cispo_rollout", *acts]), "clip", "cispo_rollout") is None, acts
    assert inert_reason(compose(["clip=cispo", "staleness=fixed"]), "clip", "cispo") is not None
    flags = option("clip", "cispo_rollout")
    assert flags.ratio_on_sampler and flags.needs_sampler_logprobs and flags.off_policy_only
    assert not option("clip", "cispo").ratio_on_sampler
