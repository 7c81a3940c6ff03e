"""Unknown sampler log-probs (NaN or -inf where the sampler gave none), one rule in every family that reads
them, in float64: proximal=loglinear|behaviour take pi_old there, the rollout corrections read a ratio of
one, the off-policy mask no divergence, the sampler-gap and staleness metrics no gap."""
import math

import pytest
import torch

from grpo_ablate.tricks import option

D = torch.float64


def impl(family, name):
    return option(family, name).impl


OLD = torch.tensor([[-1.0, -0.5, -2.0]], dtype=D)
SAMPLER = torch.tensor([[-1.2, float("nan"), -float("inf")]], dtype=D)
ONES = torch.ones(1, 3, dtype=D)


def test_loglinear_and_behaviour_take_pi_old_where_mu_is_unknown():
    for name, knobs in (("loglinear", {}), ("loglinear", {"versions": "next"}), ("behaviour", {})):
        got, _ = impl("proximal", name)(OLD, SAMPLER, torch.tensor([[3]]), ONES, **knobs)
        assert got[0, 1].item() == -0.5 and got[0, 2].item() == -2.0, name      # pi_old, never mu = 1
        assert math.isfinite(got[0, 0].item())


@pytest.mark.parametrize("name", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "decoupled",
                                  "m2po", "rejection", "tv_filter"])
def test_rollout_corrections_read_an_unknown_mu_as_ratio_one(name):
    weights, metrics = impl("rollout_correction", name)(OLD, SAMPLER, ONES)
    same, _ = impl("rollout_correction", name)(OLD, torch.tensor([[-1.2, -0.5, -2.0]], dtype=D), ONES)
    torch.testing.assert_close(weights, same)       # NaN and -inf read as mu = pi_old on those tokens
    assert all(math.isfinite(v) for v in metrics.values())


def test_off_policy_mask_reads_an_unknown_mu_as_no_divergence():
    adv = torch.tensor([[-1.0]], dtype=D)
    unknown = torch.tensor([[float("nan"), float("nan"), -float("inf")]], dtype=D)
    keep = impl("off_policy_mask", "sequence")(OLD, unknown, adv, ONES, delta=0.0)
    assert torch.equal(keep, ONES)


def test_the_sampler_gap_and_staleness_metrics_read_an_unknown_mu_as_no_gap():
    from grpo_ablate.train.metrics import sampler_gap_metrics
    from grpo_ablate.train.metrics import age_metrics
    gap = sampler_gap_metrics(SAMPLER, OLD, ONES)
    assert gap["rollout/logprob_gap_mean"] == pytest.approx(0.2 / 3)
    assert gap["rollout/logprob_gap_max"] == pytest.approx(0.2)
    stale = age_metrics(torch.tensor([2]), None, OLD, SAMPLER, ONES)
    # E[log mu - log pi_old] with lr = log pi_old - log mu = (0.2, 0, 0): -0.2 / 3
    assert stale["staleness/behaviour_kl"] == pytest.approx(-0.2 / 3)
