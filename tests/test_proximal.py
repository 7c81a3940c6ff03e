"""Family `proximal` as AReaL has it, in float64: loglinear's versions (AReaL's own mapping by default,
`versions=next` one version ahead) and prox_logp_method=reuse_train_logp (`proximal=train_logp`).
The expected numbers are worked by hand from AReaL's source at commit
4aef98d8d818af55b43621aaadba047ae10f4e77 (2026-05-21): areal/trainer/ppo/actor.py (`grpo_loss_fn`,
`compute_prox_logp_approximations`) and areal/utils/functional/functional.py (`ppo_actor_loss_fn`)."""
import math

import pytest
import torch

from grpo_ablate.tricks import option

D = torch.float64


def impl(family, name):
    return option(family, name).impl


# ---------------------------------------------------------------- loglinear's versions
def areal_alpha(current_version: int, behaviour_version: int) -> float:
    """compute_prox_logp_approximations written out: v_prox = v_theta - 1, alpha = (v_prox - v_mu) /
    (v_theta - v_mu) where v_theta > v_mu, else 0; clamped to [0, 1]."""
    v_theta, v_prox = float(current_version), float(current_version - 1)
    diff = v_theta - behaviour_version
    alpha = (v_prox - behaviour_version) / diff if diff > 0 else 0.0
    return min(max(alpha, 0.0), 1.0)


def test_loglinear_alpha_is_areals_by_default():
    # AReaL after 7 updates: engine and rollouts at version V = 7 (global_step + 1); a row of age a was
    # sampled by version 7 - a. AReaL's numbers for ages 0..4: 0, 0, 1/2, 2/3, 3/4.
    table = [areal_alpha(7, 7 - age) for age in range(5)]
    assert table == pytest.approx([0.0, 0.0, 0.5, 2 / 3, 0.75])
    theta = torch.zeros(5, 1, dtype=D)                # log pi_theta (the anchor forward)
    mu = torch.full((5, 1), -1.0, dtype=D)            # log mu
    ages = torch.arange(5)[:, None]
    got, _ = impl("proximal", "loglinear")(theta, mu, ages, torch.ones(5, 1, dtype=D))
    # log pi_prox = log mu + alpha (log pi_theta - log mu) = -1 + alpha
    torch.testing.assert_close(got[:, 0], torch.tensor([-1.0 + a for a in table], dtype=D))


def test_loglinear_next_is_one_version_ahead():
    theta, mu = torch.zeros(5, 1, dtype=D), torch.full((5, 1), -1.0, dtype=D)
    got, _ = impl("proximal", "loglinear")(theta, mu, torch.arange(5)[:, None], torch.ones(5, 1, dtype=D),
                                           versions="next")
    torch.testing.assert_close(got[:, 0], torch.tensor([-1.0 + a / (a + 1) for a in range(5)], dtype=D))


# ---------------------------------------------------------------- prox_logp_method=reuse_train_logp
def test_reuse_train_logp_takes_the_ratio_against_the_forwards_own_log_probs():
    """AReaL grpo_loss_fn with REUSE_TRAIN_LOGP: prox_logp = logprobs.detach(), so ppo_actor_loss_fn's
    ratio exp(logp - prox) is 1 and the clip never binds: per token -A, gradient -A d log pi. With
    recompute the same tokens (ratio e^0.5 = 1.65 for A > 0, e^-0.5 = 0.61 for A < 0, outside
    [0.8, 1.2]) are clipped: value -A clip(r), gradient 0."""
    from grpo_ablate.config.compose import compose
    from grpo_ablate.config.spec import run_spec
    from grpo_ablate.train.losses import LossInputs, LossTerms
    from grpo_ablate.train.step import Coefficients
    none = Coefficients(kl=0.0, kl_prev=0.0, entropy=0.0, value=0.0)
    mask = torch.ones(2, 2, dtype=D)
    advantages = torch.tensor([[1.0], [-1.0]], dtype=D)
    pi_old = torch.tensor([[-1.0, -2.0], [-1.5, -0.5]], dtype=D)
    theta = pi_old + torch.tensor([[0.5], [-0.5]], dtype=D)     # the policy has moved since pi_old
    for name, value, grad, gap in (("train_logp", [[-1, -1], [1, 1]], [[-1, -1], [1, 1]], 0.5),
                                   ("recompute", [[-1.2, -1.2], [0.8, 0.8]], [[0, 0], [0, 0]], None)):
        logp = theta.clone().requires_grad_()
        terms, stats = LossTerms(run_spec(compose([f"proximal={name}"])).tricks)(
            logp, torch.zeros_like(logp), None, LossInputs(mask, advantages, old_logp=pi_old), none)
        terms["policy"].sum().backward()
        torch.testing.assert_close(terms["policy"].detach(), torch.tensor(value, dtype=D), rtol=0, atol=1e-12)
        torch.testing.assert_close(logp.grad, torch.tensor(grad, dtype=D), rtol=0, atol=1e-12)
        if gap is None:
            assert "proximal/train_logp_gap" not in stats
        else:
            torch.testing.assert_close(stats["proximal/train_logp_gap"], torch.full((2, 2), gap, dtype=D))


def test_reuse_train_logp_makes_every_ratio_trick_inert_and_is_itself_inert_with_one_step():
    from grpo_ablate.config.compose import compose
    from grpo_ablate.config.inert import inert_reason
    assert "is recompute with one optimizer step" in inert_reason(compose(["proximal=train_logp"]), "proximal",
                                                                    "train_logp")
    several = compose(["proximal=train_logp", "updates=mini_batches"])
    assert inert_reason(several, "proximal", "train_logp") is None
    assert "cannot act with proximal=train_logp" in inert_reason(several, "clip", "higher")
    assert inert_reason(compose(["updates=mini_batches"]), "clip", "higher") is None     # recompute: it acts


def test_reuse_train_logp_trains_and_its_gap_opens_after_the_first_mini_batch(small, tmp_path):
    from grpo_ablate.config.compose import compose
    from grpo_ablate.rundir.files import read_rows
    from grpo_ablate.train.grpo import train
    overrides = small + ["steps=2", "+trick=reuse_train_logp", "updates=mini_batches", "updates.mini_batches=2"]
    train(compose(overrides), tmp_path / "run", overrides)
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")[1:]
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) for r in rows)
    assert all(r["proximal/train_logp_gap"] > 0 for r in rows)     # the second mini-batch's forward has moved
