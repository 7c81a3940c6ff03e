"""rollout_correction=tv_filter: open-instruct's TV-divergence rho filtering, in float64. Each expected
vector is worked by hand (plain floats) from open-instruct 61afa0412b833420d4e4b358d5ef1ff0673ab492
(#1681), open_instruct/grpo_utils.py `compute_rho_correction` with use_rho_correction and
rho_mask_tv_divergence (its `_sequence_level_mean`, `_rho_drop_masks`):

    d = clamp(log pi_old - log mu, -10, 10) on the trained tokens (0 elsewhere), rho = e^d
    TV_i = the sequence's mean |rho - 1|; out of [low, high] -> its tokens with sign(d) * A > 0 dropped
    weights = clamp(rho, clamp_low, clamp_high) on the rest, 0 on the dropped

and the option's one difference in kind from the family: its weights read the advantages, which the
trainer supplies after the advantage chain (the `reads_advantages` flag)."""
import math

import pytest
import torch

from conftest import cli_here
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.config.inert import inert_reason
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows
from grpo_ablate.config.spec import run_spec
from grpo_ablate.train.grpo import train
from grpo_ablate.train.losses import Coefficients, LossInputs, LossTerms
from grpo_ablate.tricks import option
from grpo_ablate.tricks.loss_agg import aggregate
from test_faults import refused

D = torch.float64
TV = option("rollout_correction", "tv_filter").impl

# rho = pi_old / mu per token (mu = 1: log mu = 0); rows 1 and 2 have two trained tokens (the third is padding)
RHO = [[8.0, 0.25, 1.0], [4.0, 0.125, 1.0], [0.125, 6.0, 1.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=D)
MU = torch.zeros(3, 3, dtype=D)
OLD = torch.log(torch.tensor(RHO, dtype=D))
ADV = torch.tensor([[1.0], [-1.0], [-1.0]], dtype=D)


def sequence_tv(row, mask):
    return sum(abs(r - 1) for r, m in zip(row, mask) if m) / sum(mask)


def test_open_instructs_own_case():
    # open-instruct test_rho_mask_tv_divergence: no clamp, upper 2.0; TV 1.25 kept, 3.0 dropped (A = 1, rho >= 1)
    old = torch.log(torch.tensor([[0.25, 1.0, 4.0], [4.0, 4.0, 4.0]], dtype=D))
    weights, metrics = TV(old, torch.zeros_like(old), torch.ones_like(old), advantages=torch.ones(2, 1, dtype=D),
                          high=2.0, clamp_high=None)
    torch.testing.assert_close(weights, torch.tensor([[0.25, 1.0, 4.0], [0.0, 0.0, 0.0]], dtype=D))
    assert metrics["rollout_corr/masked_high_frac"] == pytest.approx(0.5)
    assert metrics["rollout_corr/tv_mean"] == pytest.approx((1.25 + 3.0) / 2)


def test_only_the_tokens_that_raise_the_tv_of_an_out_of_bounds_sequence_are_dropped():
    tvs = [sequence_tv(row, m) for row, m in zip(RHO, MASK.tolist())]
    assert tvs == pytest.approx([7.75 / 3, 3.875 / 2, 5.875 / 2])     # 2.583 out, 1.9375 in, 2.9375 out (high 2)
    weights, metrics = TV(OLD, MU, MASK, advantages=ADV)              # the defaults: high 2, rho clamped at 2
    # row 0 (A > 0): rho 8 raises the TV -> 0; rho .25 and 1 (sign 0) kept
    # row 1: inside the bound, every token kept, 4 clamped to 2
    # row 2 (A < 0): rho .125 (d < 0) raises it -> 0; rho 6 lowers it, kept and clamped to 2
    expected = [[0.0, 0.25, 1.0], [2.0, 0.125, 0.0], [0.0, 2.0, 0.0]]
    torch.testing.assert_close(weights, torch.tensor(expected, dtype=D))
    assert metrics["rollout_corr/masked_frac"] == pytest.approx(2 / 7)
    assert metrics["rollout_corr/masked_high_frac"] == pytest.approx(2 / 7)
    assert metrics["rollout_corr/masked_low_frac"] == 0
    assert metrics["rollout_corr/clipped_frac"] == pytest.approx(3 / 7)   # rho 8, 4, 6, dropped or not
    assert metrics["rollout_corr/tv_max"] == pytest.approx(5.875 / 2)
    assert metrics["rollout_corr/is_mean"] == pytest.approx(5.375 / 7)
    assert (metrics["rollout_corr/is_max"], metrics["rollout_corr/is_min"]) == pytest.approx((2.0, 0.125))   # kept


def test_a_lower_bound_drops_from_the_sequences_below_it():
    weights, metrics = TV(OLD, MU, MASK, advantages=ADV, low=2.0, high=2.9)
    # row 0 (2.583) now inside; row 1 (1.9375) below: its rho .125 with A < 0 raises the TV; row 2 as before
    expected = [[2.0, 0.25, 1.0], [2.0, 0.0, 0.0], [0.0, 2.0, 0.0]]
    torch.testing.assert_close(weights, torch.tensor(expected, dtype=D))
    assert metrics["rollout_corr/masked_low_frac"] == pytest.approx(1 / 7)
    assert metrics["rollout_corr/masked_high_frac"] == pytest.approx(1 / 7)


def test_the_gate_reads_each_tokens_advantage_and_zero_drops_nothing():
    per_token = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0], [1.0, -1.0, 0.0]], dtype=D)   # a critic's [N, T]
    weights, _ = TV(OLD, MU, MASK, advantages=per_token, clamp_high=None)
    # row 2: rho .125 with A = +1 lowers the TV (kept); rho 6 with A = -1 lowers it too
    torch.testing.assert_close(weights, torch.tensor([[0.0, 0.25, 1.0], [4.0, 0.125, 0.0], [0.125, 6.0, 0.0]],
                                                     dtype=D))
    for advantages in (torch.zeros(3, 1, dtype=D), None):        # sign(d) * 0 = 0: nothing dropped
        weights, metrics = TV(OLD, MU, MASK, advantages=advantages)
        assert metrics["rollout_corr/masked_frac"] == 0
        torch.testing.assert_close(weights, torch.tensor(RHO, dtype=D).clamp(max=2.0) * MASK)


def test_the_log_ratio_is_clamped_at_ten_and_the_weights_at_the_knobs():
    old = torch.tensor([[15.0, 0.0], [-0.5, 0.2]], dtype=D)      # d = 15 -> 10; row 1: rho e^-.5, e^.2
    mask, adv = torch.ones(2, 2, dtype=D), torch.tensor([[-1.0], [1.0]], dtype=D)
    weights, metrics = TV(old, torch.zeros_like(old), mask, advantages=adv, clamp_high=None)
    # row 0: TV (e^10 - 1) / 2 > 2, rho e^10 with A < 0 lowers it: kept at e^10 (not e^15)
    assert weights[0].tolist() == pytest.approx([math.exp(10.0), 1.0])
    assert metrics["rollout_corr/tv_max"] == pytest.approx((math.exp(10.0) - 1) / 2)
    weights, _ = TV(old, torch.zeros_like(old), mask, advantages=adv, clamp_low=0.8, clamp_high=1.1)
    assert weights[1].tolist() == pytest.approx([0.8, 1.1])      # open-instruct rho_clamp_lower/upper_bound


def test_the_masked_loss_gradient_is_the_kept_tokens_weighted_policy_gradient():
    # the policy term through the trainer's LossTerms at pi = pi_old (ratio 1): d(-A rho)/d log pi = -A per token,
    # times the weight; token_mean over the 7 trained tokens; a dropped token carries no gradient
    weights, _ = TV(OLD, MU, MASK, advantages=ADV)
    assert not weights.requires_grad
    logp = OLD.clone().requires_grad_(True)
    terms, _ = LossTerms(run_spec(compose(["rollout_correction=tv_filter"])).tricks)(
        logp, torch.zeros_like(logp), None, LossInputs(MASK, ADV, old_logp=OLD, sampler_logp=MU, is_weights=weights),
        Coefficients(kl=0.0, kl_prev=0.0, entropy=0.0, value=0.0))
    aggregate(terms["policy"], option("loss_agg", "token_mean").impl(MASK, 3, None)).backward()
    expected = [[-a * w / 7 for w in row] for a, row in zip([1.0, -1.0, -1.0],
                                                             [[0.0, 0.25, 1.0], [2.0, 0.125, 0.0], [0.0, 2.0, 0.0]])]
    torch.testing.assert_close(logp.grad, torch.tensor(expected, dtype=D))
    eps, i, j = 1e-6, 1, 0       # and a central difference on one kept token
    def loss(shift):
        moved = OLD.clone()
        moved[i, j] += shift
        return aggregate(LossTerms(run_spec(compose(["rollout_correction=tv_filter"])).tricks)(
            moved, torch.zeros_like(moved), None, LossInputs(MASK, ADV, old_logp=OLD, sampler_logp=MU,
                                                             is_weights=weights),
            Coefficients(kl=0.0, kl_prev=0.0, entropy=0.0, value=0.0))[0]["policy"],
            option("loss_agg", "token_mean").impl(MASK, 3, None)).item()
    assert (loss(eps) - loss(-eps)) / (2 * eps) == pytest.approx(logp.grad[i, j].item(), rel=1e-6)


def test_the_trainer_supplies_the_advantages_and_only_this_option_reads_them():
    tv = option("rollout_correction", "tv_filter")
    assert tv.reads_advantages and tv.weighs_by_ratio and tv.needs_old_forward
    assert not any(option("rollout_correction", name).reads_advantages
                   for name in ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask",
                                "decoupled", "m2po", "rejection"))
    assert "advantages" not in tv.config()     # supplied, never configured


def test_sampler_equal_to_trainer_is_inert_and_a_differing_one_is_not():
    assert "sampler is the trainer itself" in inert_reason(compose(["rollout_correction=tv_filter"]),
                                                           "rollout_correction", "tv_filter")
    for acts in (["staleness=fixed"], ["rollout.dtype=bfloat16"]):
        assert inert_reason(compose(["+trick=tv_rho_filter", *acts]), "rollout_correction", "tv_filter") is None


@pytest.mark.parametrize("overrides, message", [
    (["rollout_correction=tv_filter", "rollout_correction.high=-1"], "rollout_correction.high=-1 is not allowed"),
    (["rollout_correction=tv_filter", "rollout_correction.low=3"], "rollout_correction.low=3 is not allowed"),
    (["rollout_correction=tv_filter", "rollout_correction.clamp_high=0.5"], "rollout_correction.clamp_high=0.5"),
    (["rollout_correction=tv_filter", "rollout_correction.clamp_low=1.5"], "rollout_correction.clamp_low=1.5"),
    (["rollout_correction=tv_filter", "+rollout_correction.advantages=1"], "it is set by the trainer"),
    (["rollout_correction=tv_filter", "adv=optimal_token_baseline"], "computes its weights from the advantages"),
    (["+trick=tv_rho_filter", "clip=cispo_rollout"], "the mismatch would count twice"),
])
def test_bad_settings_are_one_line_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(overrides))


def test_the_refusal_is_one_line_through_the_cli(tmp_path):
    refused(cli_here("train", "rollout_correction=tv_filter", "rollout_correction.high=0", cwd=tmp_path),
            "rollout_correction.high=0 is not allowed")


@pytest.mark.full
def test_stale_rollouts_are_filtered_by_their_advantages_in_a_real_run(small, tmp_path):
    # a bound every stale sequence exceeds: with the advantages supplied, the tokens that raise the TV are dropped
    args = small + ["staleness=fixed", "staleness.k=1", "rollout_correction=tv_filter", "rollout_correction.high=1e-9",
                    "optim.lr=1e-3"]
    train(compose(args), tmp_path, args)
    rows = [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)}
            for r in read_rows(tmp_path / "metrics.jsonl")][1:]
    assert all("rollout_corr/masked_frac" in r and "rollout_corr/tv_mean" in r for r in rows)
    assert any(0 < r["rollout_corr/masked_frac"] < 1 for r in rows)       # gated by sign(d) * A: never all
