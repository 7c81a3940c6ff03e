"""rollout_correction=m2po, M2PO's denominator in float64: AReaL's code divides by the kept tokens
(the default), its docs by every trained token (`denominator=trained`). The expected numbers are worked by
hand from AReaL's source at commit 4aef98d8d818af55b43621aaadba047ae10f4e77 (2026-05-21):
areal/trainer/ppo/actor.py (`grpo_loss_fn`, `_apply_m2po_masking`) and
areal/utils/functional/functional.py (`ppo_actor_loss_fn`: `loss_mask_count` of the mask it is given)."""
import pytest
import torch

from grpo_ablate.tricks import option
from grpo_ablate.tricks.loss_agg import aggregate

D = torch.float64


def impl(family, name):
    return option(family, name).impl


# The hand case: squared log-ratios (1, .01, .01, .01), threshold .04, per-token losses (1, 2, 3, 4).
# Suffix means of the sorted M2 (1, .01, .01, .01): (.2575, .01, .01, .01): the first token is masked.
PROX = torch.zeros(1, 4, dtype=D)
MU = torch.tensor([[1.0, 0.1, -0.1, 0.1]], dtype=D)          # (log mu - log prox)^2 = 1, .01, .01, .01
MASK = torch.ones(1, 4, dtype=D)
LOSSES = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=D)


def token_mean_loss(per_token, weights):
    """loss_agg=token_mean of the weighted per-token loss, as the trainer aggregates it."""
    return aggregate(per_token * weights, option("loss_agg", "token_mean").impl(MASK, 4, None))


def test_m2po_divides_by_the_kept_tokens_as_areals_code_does():
    weights, metrics = impl("rollout_correction", "m2po")(PROX, MU, MASK, threshold=0.04)
    # AReaL: loss_mask <- M2PO mask (0, 1, 1, 1); ppo_actor_loss_fn: sum(l * mask) / count(mask) = 9 / 3
    assert token_mean_loss(LOSSES, weights).item() == pytest.approx(3.0, abs=1e-12)
    assert metrics["rollout_corr/masked_frac"] == pytest.approx(0.25)
    torch.testing.assert_close(weights, torch.tensor([[0.0, 4 / 3, 4 / 3, 4 / 3]], dtype=D))


def test_m2po_documented_formula_divides_by_every_trained_token():
    weights, _ = impl("rollout_correction", "m2po")(PROX, MU, MASK, threshold=0.04, denominator="trained")
    # docs/en/algorithms/m2po.md: 1 / sum_i |o_i|: 9 / 4
    assert token_mean_loss(LOSSES, weights).item() == pytest.approx(2.25, abs=1e-12)


def test_m2po_kept_gradient_is_the_kept_tokens_mean():
    logp = torch.tensor([[-0.5, -1.0, -1.5, -2.0]], dtype=D, requires_grad=True)
    weights, _ = impl("rollout_correction", "m2po")(PROX, MU, MASK, threshold=0.04)
    token_mean_loss(-logp, weights).backward()       # REINFORCE with A = 1: d/dlogp = -1 / N_kept on kept tokens
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1 / 3, -1 / 3, -1 / 3]], dtype=D))


def test_m2po_without_mismatch_keeps_every_token_at_weight_one():
    weights, metrics = impl("rollout_correction", "m2po")(PROX, PROX, MASK)
    assert torch.equal(weights, MASK) and metrics["rollout_corr/masked_frac"] == 0
