"""rollout_correction=rejection: one option for the rejection masks of AReaL, verl, SkyRL,
ROLL and OpenRLHF, in float64. Each expected vector is worked by hand (plain floats) from the
reference's source: AReaL 4aef98d8d818af55b43621aaadba047ae10f4e77 (areal/utils/functional/
functional.py `apply_rejection_sampling`, areal/utils/data.py `KLEstimator._compute_approx_kl`),
verl b178a3cd56f58b2d502255daba591e92833930a7 (verl/trainer/ppo/rollout_corr_helper.py
`compute_rollout_rejection_mask`, verl/trainer/config/algorithm.py `decoupled_k3_rs`), ROLL
7468a0b65a3590a3514dc0cf4ef3ed1cb15195f5 (roll/utils/train_infer_corrections.py
`_compute_all_granularity`); SkyRL's outlier mask is as its config describes it (any token's ratio
outside [1e-4, 100] masks the sequence)."""
import math

import pytest
import torch

from conftest import refused_train
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.tricks import option
from grpo_ablate.tricks.loss_agg import aggregate

D = torch.float64
REJECT = option("rollout_correction", "rejection").impl

# lr = log pi_old - log mu per token; row 0 three tokens, row 1 two (the third is padding)
LR = [[0.1, -0.2, 0.05], [0.3, 0.4, 9.0]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
MU = torch.tensor([[-1.0, -0.5, -2.0], [-0.7, -1.5, -0.1]], dtype=D)
OLD = MU + torch.tensor(LR, dtype=D)


def k3(lr):
    return math.exp(lr) - 1 - lr


def test_default_is_verls_seq_mean_k3_trust_region_mask():
    # verl seq_mean_k3 with threshold 0.01: mean over a row's tokens of e^lr - 1 - lr <= 0.01
    row0 = (k3(0.1) + k3(-0.2) + k3(0.05)) / 3      # 0.00839 -> kept
    row1 = (k3(0.3) + k3(0.4)) / 2                  # 0.0679 -> masked
    assert row0 < 0.01 < row1
    weights, metrics = REJECT(OLD, MU, MASK)
    assert weights.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    assert metrics["rollout_corr/rejected_frac"] == pytest.approx(2 / 5)
    weights, _ = REJECT(OLD, MU, MASK, high=0.008)                     # row 0 (0.00839) now outside
    assert torch.equal(weights, torch.zeros_like(MASK))


def test_token_k2_and_seq_max_k2_as_verl_computes_them():
    # verl token_k2: lr^2 / 2 <= 0.05 per token; seq_max_k2: the row's largest
    weights, _ = REJECT(OLD, MU, MASK, metric="k2", level="token", high=0.05)
    assert weights.tolist() == [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]        # 0.045 in, 0.08 out
    weights, _ = REJECT(OLD, MU, MASK, metric="k2", aggregation="max", high=0.05)
    assert weights.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


def test_k3_areal_is_areals_code_not_its_help_text():
    # AReaL KLEstimator k3 on (log pi_prox, log mu): e^{-lr} - 1 + lr; verl (and AReaL's help text) e^lr - 1 - lr
    lr = 0.4
    areal, verl = math.exp(-lr) - 1 + lr, math.exp(lr) - 1 - lr      # 0.0703 vs 0.0918
    for metric, value in (("k3_areal", areal), ("k3", verl)):
        _, metrics = REJECT(torch.tensor([[lr]], dtype=D), torch.zeros(1, 1, dtype=D), torch.ones(1, 1, dtype=D),
                            metric=metric, level="token", high=1.0)
        assert metrics["rollout_corr/divergence_mean"] == pytest.approx(value, abs=1e-12)


def test_areal_token_ratio_mask_weighted_is_the_decoupled_option():
    # AReaL's example config (token, mask, ratio, upper 5) = rollout_correction=decoupled
    old = MU + torch.tensor([[0.1, 2.0, -0.3], [1.5, -0.2, 0.0]], dtype=D)     # e^2 = 7.4 > 5
    weights, _ = REJECT(old, MU, MASK, metric="ratio", level="token", weighted=True, high=5.0)
    expected, _ = option("rollout_correction", "decoupled").impl(old, MU, MASK)
    torch.testing.assert_close(weights, expected)
    assert weights[0, 1].item() == 0.0 and weights[1, 0].item() == pytest.approx(math.exp(1.5))


def test_areal_sequence_ratio_weights_are_the_geometric_mean_and_clamp_only_out_of_bounds_rows():
    # AReaL sequence + ratio: weight = exp(mean lr) on every token; agg mean in log space; clamp action
    g0, g1 = math.exp((0.1 - 0.2 + 0.05) / 3), math.exp((0.3 + 0.4) / 2)      # 0.983, 1.419
    weights, metrics = REJECT(OLD, MU, MASK, metric="ratio", aggregation="mean", action="clamp", weighted=True,
                              high=1.2, low=0.8)
    assert 0.8 < g0 < 1.2 < g1                                                # row 1 out of bounds: clamped
    torch.testing.assert_close(weights, torch.tensor([[g0] * 3, [1.2, 1.2, 0.0]], dtype=D))
    assert metrics["rollout_corr/rejected_frac"] == pytest.approx(2 / 5)
    # agg sum in log space: the product of ratios exp(0.7) = 2.01 > 1.2 for row 1; row 0 exp(-0.05)
    weights, _ = REJECT(OLD, MU, MASK, metric="ratio", aggregation="sum", high=1.2, low=0.8)
    assert weights.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


def test_skyrl_outlier_tokens_mask_their_whole_sequence():
    old = MU + torch.tensor([[0.1, 5.0, 0.0], [-0.2, 0.1, 0.0]], dtype=D)     # e^5 = 148 > 100
    weights, _ = REJECT(old, MU, MASK, metric="ratio", aggregation="all", low=1e-4, high=100.0)
    assert weights.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    # the geometric mean of row 0 (e^{5.1/3} = 5.5) would pass a [1e-4, 100] bound: `all` is not `mean`
    weights, _ = REJECT(old, MU, MASK, metric="ratio", aggregation="mean", low=1e-4, high=100.0)
    assert weights[0].tolist() == [1.0, 1.0, 1.0]


def test_roll_probability_difference_filter():
    # ROLL diff_token = exp(old) - exp(infer), kept in [-0.2, 0.2]; agg geometric = the row's mean diff
    diffs = [[math.exp(o) - math.exp(m) for o, m in zip(orow, mrow)] for orow, mrow in zip(OLD.tolist(), MU.tolist())]
    # diffs: row 0 (0.039, -0.110, 0.007), row 1 (0.174, 0.110): [-0.1, 0.15] drops -0.110 and 0.174
    weights, _ = REJECT(OLD, MU, MASK, metric="prob_diff", level="token", low=-0.1, high=0.15)
    expected = [[1.0 if -0.1 <= d <= 0.15 else 0.0 for d in row] for row in diffs]
    expected[1][2] = 0.0                                                       # padding
    assert weights.tolist() == expected == [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]
    weights, _ = REJECT(OLD, MU, MASK, metric="prob_diff", aggregation="mean", low=-0.1, high=0.14)
    row_means = [sum(diffs[0]) / 3, sum(diffs[1][:2]) / 2]                     # -0.021 in, 0.142 out
    assert row_means[0] < 0.14 < row_means[1]
    assert weights.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


def test_kept_denominator_and_the_gradient_of_the_weighted_loss():
    # token k2 <= 0.05 keeps 4 of 5 tokens; token_mean of A * logp: trained -> /5, kept -> /4
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]], dtype=D, requires_grad=True)
    token_mean = option("loss_agg", "token_mean").impl(MASK, 3, None)
    for denominator, n in (("trained", 5), ("kept", 4)):
        weights, _ = REJECT(OLD, MU, MASK, metric="k2", level="token", high=0.05, denominator=denominator)
        assert not weights.requires_grad
        logp.grad = None
        aggregate(-logp * weights, token_mean).backward()
        expected = [[-1 / n] * 3, [-1 / n, 0.0, 0.0]]
        torch.testing.assert_close(logp.grad, torch.tensor(expected, dtype=D))


def verl_chain(criteria, thresholds):
    """verl compute_rollout_rejection_mask for a chain, in plain floats: token_k1 = -lr within
    [log l, log u]; seq_max_k3 = the row's largest e^lr - 1 - lr <= u; the masks multiplied."""
    out = []
    for row, mask in zip(LR, MASK.tolist()):
        keep = [1.0] * len(row)
        for name, bound in zip(criteria, thresholds):
            trained = [lr for lr, m in zip(row, mask) if m]
            if name == "token_k1":
                one = [1.0 if math.log(bound[0]) <= -lr <= math.log(bound[1]) else 0.0 for lr in row]
            elif name == "seq_max_k3":
                one = [1.0 if max(k3(lr) for lr in trained) <= bound else 0.0] * len(row)
            else:   # seq_mean_k1
                mean = sum(-lr for lr in trained) / len(trained)
                one = [1.0 if math.log(bound[0]) <= mean <= math.log(bound[1]) else 0.0] * len(row)
            keep = [a * b for a, b in zip(keep, one)]
        out.append([k * m for k, m in zip(keep, mask)])
    return out


@pytest.mark.parametrize("criteria, thresholds, expected", [
    (["token_k1", "seq_max_k3"], [[0.95, 1.15], 0.1], [[0, 0, 1], [0, 0, 0]]),   # token_k1 alone decides
    (["seq_max_k3"], [0.09], [[1, 1, 1], [0, 0, 0]]),                             # row 1: k3(.4) = .0918
    (["token_k1", "seq_max_k3"], [[0.5, 2.0], 0.09], [[1, 1, 1], [0, 0, 0]]),     # seq_max_k3 alone decides
    (["seq_mean_k1"], [[0.75, 1.05]], [[1, 1, 1], [0, 0, 0]]),   # mean -lr: row 0 .017 in, row 1 -.35 < log .75
])
def test_chained_criteria_are_verls_comma_separated_rollout_rs(criteria, thresholds, expected):
    weights, metrics = REJECT(OLD, MU, MASK, criteria=criteria, thresholds=thresholds)
    assert weights.tolist() == verl_chain(criteria, thresholds) == [[float(v) for v in row] for row in expected]
    kept = sum(map(sum, expected))
    assert metrics["rollout_corr/rejected_frac"] == pytest.approx(1 - kept / 5)
    logp = OLD.clone().requires_grad_(True)      # a rejected token carries no gradient
    (-(logp * weights * MASK).sum()).backward()
    assert logp.grad.tolist() == [[-float(v) for v in row] for row in weights.tolist()]


@pytest.mark.parametrize("overrides, message", [
    (["rollout_correction=rejection", "rollout_correction.metric=k4"], "rollout_correction.metric='k4' is not allowed"),
    (["rollout_correction=rejection", "rollout_correction.level=segment"], "rollout_correction.level='segment'"),
    (["rollout_correction=rejection", "rollout_correction.aggregation=median"], "rollout_correction.aggregation"),
    (["rollout_correction=rejection", "rollout_correction.action=drop"], "rollout_correction.action='drop'"),
    (["rollout_correction=rejection", "rollout_correction.low=1.0"], "rollout_correction.low=1.0 is not allowed"),
    (["rollout_correction=rejection", "rollout_correction.action=clamp"], "clamps the importance weight"),
    (["rollout_correction=m2po", "rollout_correction.denominator=all"], "rollout_correction.denominator='all'"),
    (["proximal=loglinear", "proximal.versions=v2"], "proximal.versions='v2' is not allowed"),
    (["rollout_correction=rejection", "rollout_correction.criteria=[token_k4]", "rollout_correction.thresholds=[1]"],
     "a list of verl rollout_rs criteria"),
    (["rollout_correction=rejection", "rollout_correction.criteria=[token_k2,seq_max_k3]",
      "rollout_correction.thresholds=[0.1]"], "one threshold per criterion"),
    (["rollout_correction=rejection", "rollout_correction.criteria=[token_k1]", "rollout_correction.thresholds=[2.0]"],
     r"token_k1 takes \[lower, upper\]"),
    (["rollout_correction=rejection", "rollout_correction.criteria=[seq_mean_k3]",
      "rollout_correction.thresholds=[[1,2]]"], "seq_mean_k3 takes one positive number"),
    (["rollout_correction=rejection", "rollout_correction.criteria=[token_k1]",
      "rollout_correction.thresholds=[[2.0,1.0]]"], "lower <= upper"),
])
def test_bad_settings_are_one_line_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(overrides))


# ------------------------------------------------------------------ KPop: metric binary_kl
def bernoulli_kl(p, q):
    """AReaL 13353cc67 compute_binary_kl_divergence in plain floats: p, q clamped to [1e-8, 1 - 1e-8]."""
    p, q = (min(max(x, 1e-8), 1 - 1e-8) for x in (p, q))
    return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))


# (pi_old, mu) per token: row 0 three tokens, row 1 one (the other two are padding)
KPOP_P = [[0.9, 0.95, 0.5], [1.0, 0.3, 0.3]]
KPOP_Q = [[0.1, 0.1, 0.5], [0.5, 0.3, 0.3]]


def test_kpop_masks_tokens_whose_larger_bernoulli_kl_exceeds_phi_and_weights_the_rest():
    # AReaL apply_rejection_sampling, metric binary_kl, level token, action mask, upper 2.0, under
    # use_decoupled_loss (behave_imp_weight = p / q on the kept tokens):
    #   (.9, .1):  both ways .8 ln 9 = 1.758 <= 2            -> kept, weight 9
    #   (.95, .1): KL(P||Q) = .95 ln 9.5 + .05 ln(.05/.9) = 1.994 <= 2, but
    #              KL(Q||P) = .1 ln(.1/.95) + .9 ln(.9/.05) = 2.376 > 2   -> masked (the reverse decides)
    #   (.5, .5):  0                                          -> kept, weight 1
    #   (1, .5):   p clamped to 1 - 1e-8: KL(Q||P) = .5 ln .5 + .5 ln(.5 / 1e-8) = 8.52 -> masked
    kls = [[max(bernoulli_kl(p, q), bernoulli_kl(q, p)) for p, q in zip(prow, qrow)]
           for prow, qrow in zip(KPOP_P, KPOP_Q)]
    assert kls[0][0] == pytest.approx(0.8 * math.log(9)) and bernoulli_kl(0.95, 0.1) < 2.0 < kls[0][1]
    assert kls[1][0] == pytest.approx(0.5 * math.log(0.5) + 0.5 * math.log(0.5 / 1e-8), rel=1e-6)
    old = torch.tensor([[math.log(p) for p in row] for row in KPOP_P], dtype=D)
    mu = torch.tensor([[math.log(q) for q in row] for row in KPOP_Q], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=D)
    weights, metrics = REJECT(old, mu, mask, metric="binary_kl", level="token", weighted=True, high=2.0)
    torch.testing.assert_close(weights, torch.tensor([[9.0, 0.0, 1.0], [0.0, 0.0, 0.0]], dtype=D))
    assert metrics["rollout_corr/rejected_frac"] == pytest.approx(2 / 4)
    assert metrics["rollout_corr/divergence_mean"] == pytest.approx((kls[0][0] + kls[0][1] + 0.0 + kls[1][0]) / 4)
    # the gradient of the weighted loss: a masked token carries none, a kept one its weight
    logp = old.clone().requires_grad_(True)
    (-(logp * weights).sum()).backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-9.0, 0.0, -1.0], [0.0, 0.0, 0.0]], dtype=D))


def test_kpop_keeps_a_token_whose_sampler_logprob_is_unknown():
    # behaviour.known_or: an unknown (NaN) sampler log-prob is the trainer's own, divergence 0, ratio 1
    weights, _ = REJECT(torch.tensor([[-0.1]], dtype=D), torch.tensor([[float("nan")]], dtype=D),
                        torch.ones(1, 1, dtype=D), metric="binary_kl", level="token", weighted=True, high=2.0)
    assert weights.tolist() == [[1.0]]


def test_kpop_is_finite_for_a_certain_token_in_float32():
    # log-prob 0 (p = 1) on both sides: in float32 AReaL's clamp to 1 - 1e-8 rounds to 1 and its KL is
    # 0 * log(0 / 0) = NaN (the token masked); computed in float64 the clamp holds and the KL is 0
    one = torch.zeros(1, 2)
    weights, metrics = REJECT(one, torch.tensor([[0.0, math.log(0.5)]]), torch.ones(1, 2), metric="binary_kl",
                              level="token", weighted=True, high=2.0)
    assert weights.dtype == torch.float32 and weights[0, 0].item() == 1.0 and weights[0, 1].item() == 0.0
    assert math.isfinite(metrics["rollout_corr/divergence_mean"])


def test_the_kpop_trick_selects_areals_example_settings():
    cfg = compose(["+trick=kpop"])
    validate(cfg)
    rc = cfg.rollout_correction
    assert (rc.name, rc.metric, rc.level, rc.action, rc.weighted, rc.denominator, rc.high) == \
        ("rejection", "binary_kl", "token", "mask", True, "trained", 2.0)


def test_a_kpop_threshold_of_zero_would_reject_everything_and_is_refused():
    with pytest.raises(ConfigError, match="metric=binary_kl is never below 0"):
        validate(compose(["+trick=kpop", "rollout_correction.high=0"]))


# a bad value of each knob, as a user meets it: one `error:` line, exit 2, nothing written
@pytest.mark.parametrize("overrides, needle", [
    ("rollout_correction=rejection rollout_correction.criteria=[token_k9] rollout_correction.thresholds=[1]",
     "rollout_correction.criteria"),
    ("rollout_correction=rejection rollout_correction.criteria=[token_k1] rollout_correction.thresholds=[1]",
     "rollout_correction.thresholds"),
])
def test_a_bad_rejection_value_is_one_line_exit_2_and_no_run_dir(tmp_path, overrides, needle):
    refused_train(overrides, needle, tmp_path)
