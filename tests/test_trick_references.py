"""The tricks' functions (clip, kl, adv, masks, rollout correction, ref sync;
../shared/TRICKS_V2.md) against their references, in float64.

Every expected vector is computed here from the reference's formula, written out separately
(plain Python floats, loops over sequences), never by calling the function under test. The
references are verl 0.9.1 (core_algos.py, rollout_corr_helper.py) and TRL 1.16
(grpo_trainer.py, callbacks.py); each test names the function it mirrors.
"""
import math
import statistics

import pytest
import torch

from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import option_flags, trick_families, validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.tricks.registry import all_options
from grpo_ablate.tricks import option, options
from grpo_ablate.tricks.kl import k2, k3, kl_reward_penalty
from grpo_ablate.tricks.token_mask import linear_quantile

D = torch.float64


def impl(family, name):
    return option(family, name).impl


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def seq_mean_token_mean(mask):
    """loss_agg weights of GRPO's aggregation, by hand: 1 / (B n_i) on the tokens of sequence i."""
    n = mask.sum(1, keepdim=True)
    live = (n > 0).sum()
    return mask / n.clamp(min=1) / live


# Two sequences, lengths 3 and 2 (T = 3): the running example of the policy-loss tests.
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
OLD = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]], dtype=D)
DELTA = [[0.10, -0.05, 0.20], [-0.30, 0.10, 0.90]]          # log pi - log pi_old (the last is padding)
ADV = torch.tensor([[1.0], [-2.0]], dtype=D)


def current(delta=DELTA):
    return (OLD + torch.tensor(delta, dtype=D)).requires_grad_(True)


# ---------------------------------------------------------------- GSPO
def test_gspo_value_and_sequence_gradient_match_verl_and_trl():
    logp = current()
    loss, stats = impl("clip", "gspo")(logp, OLD, ADV, MASK, eps_low=0.2, eps_high=0.2)
    # verl compute_policy_loss_gspo: s_i = exp(mean over trained tokens of Delta)
    s0 = math.exp((0.10 - 0.05 + 0.20) / 3)          # 1.087 inside [0.8, 1.2]
    s1 = math.exp((-0.30 + 0.10) / 2)                # 0.905 inside: A < 0 -> -A s
    expected = [[-1.0 * s0] * 3, [2.0 * s1] * 3]     # every token carries its sequence's value
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=D))
    assert stats["clip/high_frac"].sum() == 0 and stats["clip/low_frac"].sum() == 0
    # the gradient under seq_mean_token_mean: -(A_i s_i / n_i) / B on each trained token
    (loss * seq_mean_token_mean(MASK)).sum().backward()
    grad = [[-1.0 * s0 / 3 / 2] * 3, [2.0 * s1 / 2 / 2] * 2 + [0.0]]
    torch.testing.assert_close(logp.grad, torch.tensor(grad, dtype=D))
    # TRL importance_sampling_level="sequence": a [B, 1] ratio through the whole mean, `grpo` loss
    trl_logp = current()
    coef = torch.exp((((trl_logp - OLD) * MASK).sum(-1, keepdim=True) / MASK.sum(-1, keepdim=True)))
    per_token = -torch.minimum(coef * ADV, coef.clamp(0.8, 1.2) * ADV)
    ((per_token * MASK).sum(-1) / MASK.sum(-1)).mean().backward()
    torch.testing.assert_close(trl_logp.grad, logp.grad)


def test_gspo_clips_whole_sequences_and_caps_the_log_ratio():
    logp = current([[0.5, 0.5, 0.5], [0.0, 0.0, 0.0]])       # s0 = e^0.5 > 1 + eps, A > 0: clipped
    loss, stats = impl("clip", "gspo")(logp, OLD, ADV, MASK, eps_low=3e-4, eps_high=4e-4)
    torch.testing.assert_close(loss[0], torch.full((3,), -(1 + 4e-4), dtype=D))
    assert stats["clip/high_frac"][0].tolist() == [1.0, 1.0, 1.0]
    (loss * seq_mean_token_mean(MASK)).sum().backward()
    assert torch.all(logp.grad[0] == 0)                        # the clipped sequence learns nothing
    big = current([[40.0] * 3, [0.0] * 3])
    huge, _ = impl("clip", "gspo")(big, OLD, -ADV, MASK)      # verl clamps log s_it <= 10
    assert torch.isfinite(huge).all() and huge[0, 0].item() == pytest.approx(math.exp(10.0))


# ---------------------------------------------------------------- CISPO (verl and TRL)
def test_cispo_weight_is_clipped_and_carries_no_gradient():
    logp = current([[0.5, -0.05, 0.0], [0.0, 0.10, 0.0]])
    loss, stats = impl("clip", "cispo")(logp, OLD, ADV, MASK, eps_low=0.2, eps_high=0.2)
    # verl compute_policy_loss_cispo: -sg(clip(rho, 0.8, 1.2)) A log pi
    w = [[min(max(math.exp(d), 0.8), 1.2) for d in row] for row in [[0.5, -0.05, 0.0], [0.0, 0.10, 0.0]]]
    lp = logp.detach().tolist()
    a = [1.0, -2.0]
    expected = [[-w[i][t] * a[i] * lp[i][t] for t in range(3)] for i in range(2)]
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=D))
    loss.sum().backward()
    # the gradient is -w A: no gradient through w, and a clipped token (rho = e^0.5) still learns
    torch.testing.assert_close(logp.grad, torch.tensor([[-w[i][t] * a[i] for t in range(3)] for i in range(2)],
                                                       dtype=D))
    assert logp.grad[0, 0].item() == pytest.approx(-1.2)
    assert stats["clip/high_frac"].tolist() == [[1, 0, 0], [0, 0, 0]]


def test_cispo_trl_caps_the_weight_absolutely():
    deltas = [[2.0, 0.5, -1.0], [0.0, 1.7, 0.0]]
    logp = current(deltas)
    loss, stats = impl("clip", "cispo_trl")(logp, OLD, ADV, MASK, eps_max=5.0)
    # TRL loss_type="cispo": clamp(coef_1, max=epsilon_high).detach() * -A * logp
    w = [[min(math.exp(d), 5.0) for d in row] for row in deltas]
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-w[i][t] * [1.0, -2.0][i] for t in range(3)]
                                                        for i in range(2)], dtype=D))
    assert w[0][0] == 5.0 and w[0][1] == pytest.approx(math.exp(0.5))   # e^2 > 5 is capped, e^0.5 is not
    assert stats["clip/high_frac"].tolist() == [[1, 0, 0], [0, 1, 0]]   # e^1.7 = 5.47 > 5 too


# ---------------------------------------------------------------- SAPO
def test_sapo_soft_gate_value_and_gradient():
    deltas = [[0.3, -0.2, 0.0], [0.4, -0.1, 0.0]]
    logp = current(deltas)
    loss, stats = impl("clip", "sapo")(logp, OLD, ADV, MASK, tau_pos=1.0, tau_neg=1.05)
    expected, grad = [], []
    for row, a, tau in zip(deltas, [1.0, -2.0], [1.0, 1.05]):     # verl gate_function; tau by the sign of A
        rho = [math.exp(d) for d in row]
        expected.append([-sigmoid(tau * (r - 1)) * 4 / tau * a for r in rho])
        grad.append([-4 * sigmoid(tau * (r - 1)) * (1 - sigmoid(tau * (r - 1))) * r * a for r in rho])
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=D))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor(grad, dtype=D))
    assert stats["sapo/grad_weight_dev"][0, 2].item() == pytest.approx(0.0)   # rho = 1: the plain gradient
    assert stats["sapo/grad_weight_dev"][0, 0].item() > 0


# ---------------------------------------------------------------- GMPO
def test_gmpo_geometric_mean_with_log_space_clipping():
    deltas = [[0.6, -0.1, 0.2], [-0.7, 0.3, 0.0]]
    logp = current(deltas)
    loss, stats = impl("clip", "gmpo")(logp, OLD, ADV, MASK, eps_low=0.4, eps_high=0.4)
    # verl compute_policy_loss_geo_mean: sgn(A) min(sgn(A) D, sgn(A) clip(D)) per token, then exp(mean)
    def pessimistic(d, a):
        s = 1.0 if a > 0 else -1.0
        return s * min(s * d, s * max(-0.4, min(0.4, d)))
    rho0 = math.exp(sum(pessimistic(d, 1.0) for d in deltas[0]) / 3)    # 0.6 -> 0.4 (A > 0 clips the top)
    rho1 = math.exp(sum(pessimistic(d, -2.0) for d in deltas[1][:2]) / 2)   # -0.7 -> -0.4 (A < 0: the bottom)
    seq_loss = [-1.0 * rho0, 2.0 * rho1]
    torch.testing.assert_close(loss, torch.tensor([[seq_loss[0]] * 3, [seq_loss[1]] * 3], dtype=D))
    total = (loss * seq_mean_token_mean(MASK)).sum()
    assert total.item() == pytest.approx(sum(seq_loss) / 2)          # verl: torch.mean over sequences
    total.backward()
    # clipped tokens get no gradient; the others -A_i rho_i / n_i / B
    grad = [[0.0, -rho0 / 3 / 2, -rho0 / 3 / 2], [0.0, 2.0 * rho1 / 2 / 2, 0.0]]
    torch.testing.assert_close(logp.grad, torch.tensor(grad, dtype=D))
    assert stats["clip/high_frac"].tolist() == [[1, 0, 0], [0, 0, 0]]
    assert stats["clip/low_frac"].tolist() == [[0, 0, 0], [1, 0, 0]]


# ---------------------------------------------------------------- Clip-Cov and KL-Cov
COV_ADV = torch.tensor([[3.0], [-1.0], [0.0]], dtype=D)
COV_LOGP = torch.tensor([[-0.5, -1.0, -3.0], [-4.0, -0.2, -2.0], [-1.0, -1.5, -0.1]], dtype=D)
COV_MASK = torch.ones(3, 3, dtype=D)


def covariance_by_hand():
    """(A_t - mean A)(log pi_t - mean log pi) over every (trained) token, verl's cov_all."""
    a = [row[0] for row in COV_ADV.tolist() for _ in range(3)]
    lp = [x for row in COV_LOGP.tolist() for x in row]
    ma, ml = sum(a) / 9, sum(lp) / 9
    return [(ai - ma) * (li - ml) for ai, li in zip(a, lp)]


def test_clip_cov_removes_the_gradient_of_chosen_high_covariance_tokens():
    cov = covariance_by_hand()
    candidates = {k for k, c in enumerate(cov) if 1.0 < c < 5.0}
    assert candidates and len(candidates) < 9
    logp = COV_LOGP.clone().requires_grad_(True)
    # ratio 1: clip_num = 9 >= the candidates, so all are chosen (no randomness left to test)
    loss, stats = impl("clip", "clip_cov")(logp, COV_LOGP, COV_ADV, COV_MASK, ratio=1.0,
                                           generator=torch.Generator().manual_seed(0))
    loss.sum().backward()
    a = [row[0] for row in COV_ADV.tolist() for _ in range(3)]
    expected = [0.0 if k in candidates else -a[k] for k in range(9)]   # on-policy: d(-rho A) = -A
    assert logp.grad.flatten().tolist() == expected
    assert stats["clip_cov/frac"].sum().item() == len(candidates)


def test_clip_cov_draws_clip_num_of_the_candidates_reproducibly():
    cov = covariance_by_hand()
    candidates = {k for k, c in enumerate(cov) if 1.0 < c < 5.0}
    ratio = 1.0 / 9    # clip_num = max(int(ratio * 9), 1) = 1
    chosen = []
    for seed in (0, 0, 1, 2, 3):
        _, stats = impl("clip", "clip_cov")(COV_LOGP, COV_LOGP, COV_ADV, COV_MASK, ratio=ratio,
                                            generator=torch.Generator().manual_seed(seed))
        picked = set(stats["clip_cov/frac"].flatten().nonzero().flatten().tolist())
        assert len(picked) == 1 and picked <= candidates
        chosen.append(picked)
    assert chosen[0] == chosen[1]


def test_kl_cov_penalizes_the_top_covariance_tokens_and_is_plain_pg_on_policy():
    cov = covariance_by_hand()
    top = max(range(9), key=lambda k: cov[k])
    deltas = torch.full((3, 3), 0.1, dtype=D)
    logp = (COV_LOGP + deltas).requires_grad_(True)
    loss, stats = impl("clip", "kl_cov")(logp, COV_LOGP, COV_ADV, COV_MASK, ratio=1 / 9, kl_coef=0.1)
    # verl compute_policy_loss_kl_cov: -A rho everywhere, + coef |Delta| on the top-k by cov
    # (cov of the current log-probs: shifted by a constant it ranks the same)
    a = [row[0] for row in COV_ADV.tolist() for _ in range(3)]
    expected = [-a[k] * math.exp(0.1) + (0.1 * 0.1 if k == top else 0.0) for k in range(9)]
    torch.testing.assert_close(loss.flatten(), torch.tensor(expected, dtype=D))
    assert stats["kl_cov/frac"].flatten().nonzero().flatten().tolist() == [top]
    on_policy = COV_LOGP.clone().requires_grad_(True)
    impl("clip", "kl_cov")(on_policy, COV_LOGP, COV_ADV, COV_MASK, ratio=0.5)[0].sum().backward()
    torch.testing.assert_close(on_policy.grad.flatten(), torch.tensor([-x for x in a], dtype=D))


def test_gpg_loss_is_reinforce():
    logp = current()
    loss, _ = impl("clip", "gpg")(logp, OLD, ADV, MASK)
    torch.testing.assert_close(loss, -ADV * logp.detach())
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, (-ADV).expand(2, 3))


# ---------------------------------------------------------------- the off_policy_only flag
ON_POLICY_ONLY = {"clip_cov", "luspo"}   # luspo: the length scaling acts at rho == 1 too


@pytest.mark.parametrize("name", sorted(options("clip")))
def test_off_policy_only_options_have_ppo_gradient_at_rho_one(name):
    """The flag is a fact: with rho == 1 the aggregated gradient equals plain PPO-clip's."""
    torch.manual_seed(0)
    old = -torch.rand(4, 5, dtype=D) * 3
    adv = torch.randn(4, 1, dtype=D)
    mask = (torch.rand(4, 5) > 0.2).to(D)
    mask[:, 0] = 1
    weights = seq_mean_token_mean(mask)

    def gradient(loss_name, **knobs):
        logp = old.clone().requires_grad_(True)
        (impl("clip", loss_name)(logp, old, adv, mask, **knobs)[0] * weights).sum().backward()
        return logp.grad

    knobs = {"ratio": 0.5, "cov_low": -1e9, "cov_high": 1e9} if name == "clip_cov" else {}
    same = torch.allclose(gradient(name, **knobs), gradient("symmetric"))
    if option("clip", name).centres_on_old_topk:
        # its inputs are centred log-probs psi: -eta A at psi_old here too, but psi's gradient in the logits is
        # e_a - pbar, not e_a - pi: it acts at rho == 1 unless pi_old's top-K is the whole vocabulary (test_local_loss)
        assert same and not option("clip", name).off_policy_only
        return
    assert option("clip", name).off_policy_only == same
    assert same == (name not in ON_POLICY_ONLY)


# ---------------------------------------------------------------- KL estimators
LOGP = torch.tensor([-1.0, -2.0, -0.5, -0.3], dtype=D)
REF = torch.tensor([-1.5, -1.0, -0.5, -2.0], dtype=D)


def test_abs_and_straight_through_values():
    diffs = [lp - r for lp, r in zip(LOGP.tolist(), REF.tolist())]
    torch.testing.assert_close(impl("kl.estimator", "abs")(LOGP, REF, LOGP), torch.tensor([abs(d) for d in diffs],
                                                                                            dtype=D))
    torch.testing.assert_close(impl("kl.estimator", "k1_st")(LOGP, REF, LOGP), torch.tensor(diffs, dtype=D))
    k3_by_hand = [math.exp(-d) - 1 + d for d in diffs]
    torch.testing.assert_close(impl("kl.estimator", "k3_st")(LOGP, REF, LOGP), torch.tensor(k3_by_hand, dtype=D))


@pytest.mark.parametrize("name", ["k1_st", "k3_st"])
def test_straight_through_estimators_have_k2s_gradient(name):
    # verl kl_penalty "k1+" / "k3+": backward_score - sg(backward_score) + sg(forward), backward = k2
    logp = LOGP.clone().requires_grad_(True)
    impl("kl.estimator", name)(logp, REF, logp.detach()).sum().backward()
    torch.testing.assert_close(logp.grad, LOGP - REF)          # d/dlogp 0.5 (logp - ref)^2


def test_straight_through_k1_is_unbiased_in_value_and_reverse_kl_in_expected_gradient():
    torch.manual_seed(1)
    logits = torch.randn(6, dtype=D, requires_grad=True)
    ref = torch.log_softmax(torch.randn(6, dtype=D), dim=-1)
    logp = torch.log_softmax(logits, dim=-1)
    probs = logp.exp().detach()
    value = (probs * impl("kl.estimator", "k1_st")(logp, ref, logp.detach())).sum()
    reverse_kl = (logp.exp() * (logp - ref)).sum()
    torch.testing.assert_close(value, reverse_kl.detach())               # E[k1] = KL(pi || ref)
    (grad_st,) = torch.autograd.grad(value, logits, retain_graph=True)
    (grad_kl,) = torch.autograd.grad(reverse_kl, logits)
    torch.testing.assert_close(grad_st, grad_kl)


def test_importance_weighted_k3_value_and_gradient():
    old = LOGP - torch.tensor([0.2, -0.1, 0.0, 0.3], dtype=D)     # rho = e^0.2, e^-0.1, 1, e^0.3
    logp = LOGP.clone().requires_grad_(True)
    value = impl("kl.estimator", "k3_iw")(logp, REF, old)
    # TRL use_bias_correction_kl: per_token_kl * coef_1, coef_1 = exp(logp - old) with its gradient
    expected, grad = [], []
    for lp, r, o in zip(LOGP.tolist(), REF.tolist(), old.tolist()):
        k3v, rho = math.exp(r - lp) - (r - lp) - 1, math.exp(lp - o)
        expected.append(k3v * rho)
        grad.append(rho * (k3v + 1 - math.exp(r - lp)))      # d(k3 rho)/dlogp = rho (k3 + dk3/dlogp)
    torch.testing.assert_close(value, torch.tensor(expected, dtype=D))
    value.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor(grad, dtype=D))
    # on-policy (rho == 1) the gradient is k2's: log pi - log pi_ref
    on = LOGP.clone().requires_grad_(True)
    impl("kl.estimator", "k3_iw")(on, REF, on.detach()).sum().backward()
    torch.testing.assert_close(on.grad, LOGP - REF)


def test_kl_in_the_reward_with_a_chosen_estimator():
    old = torch.tensor([[-1.0, -2.0, -3.0]], dtype=D)
    ref = torch.tensor([[-1.5, -1.0, -9.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=D)
    k3_sum = (math.exp(-0.5) - 1 + 0.5) + (math.exp(1.0) - 1 - 1.0)     # log r = ref - old: -0.5, 1
    torch.testing.assert_close(kl_reward_penalty(old, ref, mask, k3), torch.tensor([k3_sum], dtype=D))
    torch.testing.assert_close(kl_reward_penalty(old, ref, mask), torch.tensor([0.5 - 1.0], dtype=D))  # k1
    torch.testing.assert_close(kl_reward_penalty(old, ref, mask, impl("kl.estimator", "k3_iw")),
                               torch.tensor([k3_sum], dtype=D))            # rho == 1 at rollout time
    torch.testing.assert_close(kl_reward_penalty(old, ref, mask, k2), torch.tensor([0.125 + 0.5], dtype=D))


# ---------------------------------------------------------------- advantages
def adv(name, rewards, groups, mask=None, components=None, **knobs):
    mask = torch.ones(len(rewards), 2, dtype=D) if mask is None else mask
    return impl("adv", name)(rewards, groups, mask, None, components or {}, **knobs)


GROUPS = torch.tensor([0, 0, 0, 1, 1, 1])
TASK = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0], dtype=D)
FORMAT = torch.tensor([0.1, 0.1, 0.0, 0.1, 0.0, 0.0], dtype=D)
LENGTHS = [2, 4, 1, 3, 3, 2]


def length_mask(lengths=LENGTHS):
    mask = torch.zeros(len(lengths), max(lengths), dtype=D)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return mask


def group_normalized(values, eps):
    """(x - mean_g) / (stdev_g + eps), Bessel std (verl torch.std, TRL nanstd)."""
    out = []
    for g in range(2):
        part = values[3 * g:3 * g + 3]
        m, s = statistics.mean(part), statistics.stdev(part)
        out += [(x - m) / (s + eps) for x in part]
    return out


def test_gdpo_verl_normalizes_each_component_then_whitens_over_tokens():
    task, fmt = TASK.tolist(), FORMAT.tolist()
    summed = [2.0 * a + b for a, b in zip(group_normalized(task, 1e-6), group_normalized(fmt, 1e-6))]
    # verl masked_whiten: token-weighted mean and (Bessel, over tokens) variance, rsqrt(var + 1e-8)
    tokens = [x for x, n in zip(summed, LENGTHS) for _ in range(n)]
    mean, var = statistics.mean(tokens), statistics.variance(tokens)
    expected = [(x - mean) / math.sqrt(var + 1e-8) for x in summed]
    got = adv("gdpo", TASK + FORMAT, GROUPS, length_mask(), {"task": TASK, "format": FORMAT}, weights={"task": 2.0})
    torch.testing.assert_close(got, torch.tensor(expected, dtype=D))


def test_gdpo_trl_whitens_over_completions_with_eps_1e4():
    task, fmt = TASK.tolist(), FORMAT.tolist()
    summed = [a + b for a, b in zip(group_normalized(task, 1e-4), group_normalized(fmt, 1e-4))]
    mean, std = statistics.mean(summed), statistics.stdev(summed)      # TRL normalize_then_sum
    expected = [(x - mean) / (std + 1e-4) for x in summed]
    got = adv("gdpo_trl", TASK + FORMAT, GROUPS, length_mask(), {"task": TASK, "format": FORMAT})
    torch.testing.assert_close(got, torch.tensor(expected, dtype=D))


def test_gdpo_keeps_a_small_component_alive_that_grpo_drowns():
    # a scale-100 task reward and a 0.1 format bonus: after GDPO both carry the same weight
    task, fmt = 100 * TASK, FORMAT
    with_both = adv("gdpo_trl", task + fmt, GROUPS, components={"task": task, "format": fmt})
    task_only = adv("gdpo_trl", task, GROUPS, components={"task": task})
    assert (with_both - task_only).abs().max() > 0.3
    assert torch.allclose(adv("gdpo", TASK, GROUPS), adv("gdpo", TASK, GROUPS, components={"task": TASK}))
    with pytest.raises(ValueError, match="adv.weights names lenght"):
        adv("gdpo", TASK, GROUPS, components={"task": TASK, "length": FORMAT}, weights={"lenght": 1.0})


def test_opo_length_weighted_baseline():
    mask = length_mask()
    expected = []
    for g in range(2):   # verl compute_opo_outcome_advantage: b = sum |o| r / sum |o|
        r, n = TASK.tolist()[3 * g:3 * g + 3], LENGTHS[3 * g:3 * g + 3]
        b = sum(ni * ri for ni, ri in zip(n, r)) / sum(n)
        expected += [ri - b for ri in r]
    torch.testing.assert_close(adv("opo", TASK, GROUPS, mask), torch.tensor(expected, dtype=D))
    assert expected[0] == pytest.approx(1 - 3 / 7)


def test_passk_only_the_best_of_a_group_learns():
    rewards = torch.tensor([0.2, 0.9, 0.5, 0.3, 0.3, 0.1, 0.7], dtype=D)
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2])        # group 2 has one completion: A = 0
    got = adv("passk", rewards, groups, eps=1e-6)
    s0 = statistics.stdev([0.2, 0.9, 0.5])
    expected = [0.0, (0.9 - 0.5) / (s0 + 1e-6), 0.0, 0.0, 0.0, 0.0, 0.0]   # group 1: a tie, gap 0
    torch.testing.assert_close(got, torch.tensor(expected, dtype=D))
    torch.testing.assert_close(adv("passk", rewards, groups, norm_by_std=False)[1], torch.tensor(0.4, dtype=D))


def test_gpg_advantage_scales_by_the_nonzero_reward_share():
    # verl compute_gpg_outcome_advantage: alpha = B / count_nonzero(r), A = alpha (r - mean_g)
    alpha = 6 / 3
    expected = [alpha * (r - m) for r, m in zip(TASK.tolist(), [2 / 3] * 3 + [1 / 3] * 3)]
    torch.testing.assert_close(adv("gpg", TASK, GROUPS), torch.tensor(expected, dtype=D))
    torch.testing.assert_close(adv("gpg", TASK, GROUPS, f_norm=2.0), torch.tensor(expected, dtype=D) / 2)


def test_token_sum_weights_are_the_mask():
    mask = length_mask()
    torch.testing.assert_close(impl("loss_agg", "token_sum")(mask, None), mask)


# ---------------------------------------------------------------- length=linear (prime-rl)
def prime_rl_linear_penalty(rewards, lengths, groups, w_out=0.25, w_ctx=0.1, w_turns=0.1):
    """prime-rl 16efd8afd GRPOAlgorithm.score_group, group by group in plain floats: penalty_i =
    mean(r_g) * (w_out out_i / max(max_g out, 1) + w_ctx ctx_i / max(max_g ctx, 1) + w_turns turns_i /
    max(max_g turns, 1)); here one prompt per group (ctx_i = max_g ctx) and one turn (turns_i = 1)."""
    out = [0.0] * len(rewards)
    for g in set(groups):
        rows = [i for i, gi in enumerate(groups) if gi == g]
        pass_rate = sum(rewards[i] for i in rows) / len(rows)
        longest = max(1, max(lengths[i] for i in rows))
        prompt_tokens, turns = 7, 1              # the same for every row of the group
        for i in rows:
            out[i] = pass_rate * (w_out * lengths[i] / longest + w_ctx * prompt_tokens / prompt_tokens
                                  + w_turns * turns / turns)
    return out


def test_linear_length_penalty_is_prime_rls():
    # group 0: rewards (1, 0, 1), lengths (2, 4, 1): pass rate 2/3, max 4; row 1's penalty
    # 2/3 * (0.25 * 4/4 + 0.1 + 0.1) = 0.3; group 1: (0, 0, 1), (3, 3, 2): 1/3 * (0.25 * 2/3 + 0.2)
    rewards, groups = TASK.tolist(), GROUPS.tolist()
    penalty = prime_rl_linear_penalty(rewards, LENGTHS, groups)
    assert penalty[1] == pytest.approx(0.3) and penalty[5] == pytest.approx((0.25 * 2 / 3 + 0.2) / 3)
    shaped, reward = impl("length", "linear")(TASK, torch.tensor(LENGTHS), GROUPS, TASK > 0, 8)
    torch.testing.assert_close(reward, -torch.tensor(penalty, dtype=D))
    torch.testing.assert_close(shaped, TASK - torch.tensor(penalty, dtype=D))
    shaped, _ = impl("length", "linear")(TASK, torch.tensor(LENGTHS), GROUPS, TASK > 0, 8, output_weight=1.0,
                                         context_weight=0.0, turns_weight=0.0)
    torch.testing.assert_close(shaped, TASK - torch.tensor(prime_rl_linear_penalty(
        rewards, LENGTHS, groups, 1.0, 0.0, 0.0), dtype=D))


def test_linear_length_penalty_with_equal_lengths_leaves_grpo_unchanged():
    # prime-rl's test_linear_equal_lengths_reduce_to_plain_grpo: a constant penalty within a group
    # cancels in the group baseline (and leaves the group's std as it was)
    shaped, _ = impl("length", "linear")(TASK, torch.full((6,), 5), GROUPS, TASK > 0, 8)
    torch.testing.assert_close(adv("grpo", shaped, GROUPS), adv("grpo", TASK, GROUPS))
    assert not torch.allclose(shaped, TASK)


# ---------------------------------------------------------------- token_mask and off_policy_mask
def test_high_entropy_mask_keeps_the_top_quantile_and_zeroes_the_rest_exactly():
    entropy = torch.tensor([[0.1, 2.0, 0.5, 9.0], [1.5, 0.3, 3.0, 0.2]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=D)        # the 9.0 is padding
    trained = sorted([0.1, 2.0, 0.5, 1.5, 0.3, 3.0, 0.2])
    position = 0.8 * (len(trained) - 1)                  # TRL: torch.quantile(·, 1 - 0.2), linear
    lo = int(position)
    threshold = trained[lo] + (position - lo) * (trained[lo + 1] - trained[lo])
    keep = impl("token_mask", "high_entropy")(entropy, mask, quantile=0.2)
    expected = [[float(e >= threshold and m > 0) for e, m in zip(er, mr)]
                for er, mr in zip(entropy.tolist(), mask.tolist())]
    assert keep.tolist() == expected == [[0, 1, 0, 0], [0, 0, 1, 0]]
    logp = torch.zeros(2, 4, dtype=D, requires_grad=True)
    (impl("clip", "symmetric")(logp, logp.detach(), torch.ones(2, 1, dtype=D), mask)[0] * keep).sum().backward()
    assert torch.equal(logp.grad == 0, keep == 0)                       # dropped tokens: exactly zero
    assert torch.equal(impl("token_mask", "high_entropy")(entropy, mask, quantile=1.0), mask)


def test_linear_quantile_matches_torch_quantile():
    values = torch.randn(1001, dtype=D, generator=torch.Generator().manual_seed(3))
    for q in (0.0, 0.2, 0.5, 0.8, 1.0):
        torch.testing.assert_close(linear_quantile(values, q), torch.quantile(values, q))


def test_off_policy_sequence_mask_drops_negative_far_off_sequences():
    logp = torch.zeros(4, 3, dtype=D, requires_grad=True)
    sampler = torch.tensor([[0.9, 0.9, 0.0], [0.9, 0.9, 0.0], [0.1, 0.2, 0.0], [2.0, -0.1, 5.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0], [1, 1, 0]], dtype=D)
    advantages = torch.tensor([[-1.0], [1.0], [-1.0], [-1.0]], dtype=D)
    keep = impl("off_policy_mask", "sequence")(logp, sampler, advantages, mask, delta=0.5)
    # TRL get_off_policy_mask: mean over trained tokens of (sampler - logp); keep if A >= 0 or <= delta
    means = [0.9, 0.9, 0.15, 0.95]
    expected = [[float(a >= 0 or d <= 0.5) * m for m in row] for a, d, row in
                zip([-1.0, 1.0, -1.0, -1.0], means, mask.tolist())]
    assert keep.tolist() == expected == [[0, 0, 0], [1, 1, 0], [1, 1, 0], [0, 0, 0]]
    (impl("clip", "symmetric")(logp, logp.detach(), advantages, mask)[0] * keep).sum().backward()
    assert torch.all(logp.grad[[0, 3]] == 0) and torch.all(logp.grad[[1, 2], :2] != 0)
    per_token = advantages.expand(4, 3).clone()
    per_token[0, 1] = 5.0                                  # token advantages: their mean decides
    assert impl("off_policy_mask", "sequence")(logp, sampler, per_token, mask)[0].tolist() == [1, 1, 0]


# ---------------------------------------------------------------- rollout_correction
RC_OLD = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]], dtype=D)
RC_SAMPLER = torch.tensor([[-1.2, -0.4, -0.6], [-0.3, -2.5, -9.0]], dtype=D)
RC_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
LOG_W = [[0.2, -0.1, -1.4], [0.0, 1.3, 0.0]]   # old - sampler on trained tokens (padding: 0)


@pytest.mark.parametrize("mode, low, high, expected", [
    # verl rollout_is=token, threshold 2.0 (TIS): min(w, 2)
    ("token_truncate", None, 2.0, [[math.exp(0.2), math.exp(-0.1), math.exp(-1.4)], [1.0, 2.0, 0.0]]),
    # TRL token_truncate with clip_min 0.5 too
    ("token_truncate", 0.5, 2.0, [[math.exp(0.2), math.exp(-0.1), 0.5], [1.0, 2.0, 0.0]]),
    # IcePop / TRL token_mask: 0 outside [0.5, 2]
    ("token_mask", 0.5, 2.0, [[math.exp(0.2), math.exp(-0.1), 0.0], [1.0, 0.0, 0.0]]),
    # sequence: exp of the sum on every token; 0.2 - 0.1 - 1.4 = -1.3, 1.3
    ("sequence_truncate", None, 2.0, [[math.exp(-1.3)] * 3, [2.0, 2.0, 0.0]]),
    ("sequence_mask", None, 3.0, [[math.exp(-1.3)] * 3, [0.0, 0.0, 0.0]]),    # e^1.3 = 3.67 > 3
])
def test_rollout_correction_weights(mode, low, high, expected):
    weights, metrics = impl("rollout_correction", mode)(RC_OLD, RC_SAMPLER, RC_MASK, low=low, high=high)
    torch.testing.assert_close(weights, torch.tensor(expected, dtype=D))
    assert not weights.requires_grad
    flat = [w for row, mrow in zip(expected, RC_MASK.tolist()) for w, m in zip(row, mrow) if m]
    assert metrics["rollout_corr/is_mean"] == pytest.approx(sum(flat) / len(flat))
    assert metrics["rollout_corr/is_max"] == pytest.approx(max(flat))


def test_rollout_correction_mismatch_metrics_are_verls():
    _, metrics = impl("rollout_correction", "token_truncate")(RC_OLD, RC_SAMPLER, RC_MASK)
    trained = [d for row, mrow in zip(LOG_W, RC_MASK.tolist()) for d, m in zip(row, mrow) if m]
    # verl compute_offpolicy_metrics: kl = E[log mu - log pi], k3_kl = E[rho - log rho - 1], chi2
    assert metrics["rollout_corr/kl"] == pytest.approx(-sum(trained) / 5)
    assert metrics["rollout_corr/k3_kl"] == pytest.approx(sum(math.exp(d) - d - 1 for d in trained) / 5)
    assert metrics["rollout_corr/chi2_token"] == pytest.approx(sum(math.exp(2 * d) for d in trained) / 5 - 1)
    assert metrics["rollout_corr/chi2_seq"] == pytest.approx((math.exp(-2.6) + math.exp(2.6)) / 2 - 1)
    assert metrics["rollout_corr/logp_diff_max"] == pytest.approx(1.4)    # TRL sampling_logp_difference/max
    assert metrics["rollout_corr/truncated_frac"] == pytest.approx(1 / 5)
    assert metrics["rollout_corr/is_fraction_high"] == pytest.approx(1 / 5)


def test_rollout_correction_renormalizes_to_mean_one():
    weights, metrics = impl("rollout_correction", "token_truncate")(RC_OLD, RC_SAMPLER, RC_MASK, renormalize=True)
    assert ((weights * RC_MASK).sum() / RC_MASK.sum()).item() == pytest.approx(1.0)
    seq, _ = impl("rollout_correction", "sequence_truncate")(RC_OLD, RC_SAMPLER, RC_MASK, renormalize=True)
    # verl: the mean of one weight per sequence is 1
    assert (seq[0, 0] + seq[1, 0]).item() == pytest.approx(2.0)
    none, none_metrics = impl("rollout_correction", "none")(RC_OLD, RC_SAMPLER, RC_MASK)
    assert torch.equal(none, torch.ones_like(RC_OLD)) and none_metrics == {}


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_rollout_correction_of_an_all_masked_batch_is_zero_and_finite(mode):
    empty = torch.zeros_like(RC_MASK)
    weights, metrics = impl("rollout_correction", mode)(RC_OLD, RC_SAMPLER, empty, renormalize=True)
    assert torch.equal(weights, torch.zeros_like(RC_OLD))
    assert all(math.isfinite(v) for v in metrics.values())


# ---------------------------------------------------------------- ref_sync
def test_mixup_moves_the_reference_toward_the_policy_in_place():
    ref = [torch.tensor([1.0, 2.0], dtype=D), torch.tensor([[0.0]], dtype=D)]
    policy = [torch.tensor([3.0, 0.0], dtype=D, requires_grad=True), torch.tensor([[10.0]], dtype=D)]
    kept = ref[0]
    impl("ref_sync", "mixup")(ref, policy, alpha=0.6)
    # TRL _sync_target_model: target.mul_(1 - alpha).add_(policy, alpha=alpha)
    torch.testing.assert_close(ref[0], torch.tensor([0.4 * 1 + 0.6 * 3, 0.4 * 2 + 0.6 * 0], dtype=D))
    torch.testing.assert_close(ref[1], torch.tensor([[6.0]], dtype=D))
    assert ref[0] is kept                                     # in place
    impl("ref_sync", "mixup")(ref, policy, alpha=1.0)
    assert torch.equal(ref[0], policy[0].detach())
    impl("ref_sync", "none")(ref, [torch.zeros(2, dtype=D), torch.zeros(1, 1, dtype=D)])
    assert torch.equal(ref[0], policy[0].detach())


# ---------------------------------------------------------------- flags, config, catalogue
def test_flags_for_the_trainer_and_the_inert_rules():
    for name in ("symmetric", "higher", "gspo", "cispo", "cispo_trl", "sapo", "gmpo", "kl_cov", "gpg"):
        assert option("clip", name).off_policy_only, name
    assert not option("clip", "clip_cov").off_policy_only
    assert option_flags("dual_clip", "enabled") == {"off_policy_only": True}
    assert option_flags("dual_clip", "none") == {}
    assert option("off_policy_mask", "sequence").needs_sampler_logprobs
    for name in options("rollout_correction"):
        assert option("rollout_correction", name).needs_sampler_logprobs == (name != "none")
    assert not option("token_mask", "high_entropy").off_policy_only


def test_new_families_are_config_groups_with_none_by_default():
    cfg = compose([])
    for family in ("token_mask", "off_policy_mask", "rollout_correction", "ref_sync"):
        assert family in trick_families() and cfg[family].name == "none"
    assert cfg.rollout.dtype == "float32"


@pytest.mark.parametrize("overrides, message", [
    (["clip=gspo", "dual_clip=enabled"], "dual_clip=enabled caps the PPO-clip loss, and clip=gspo has no dual clip"),
    (["ref_sync=mixup", "kl=none"], "ref_sync=mixup moves the reference policy, but kl=none has none"),
    (["rollout.dtype=float16"], "rollout.dtype='float16' is not allowed; allowed: float32, bfloat16"),
    (["token_mask=high_entropy", "token_mask.quantile=1.5"], "token_mask.quantile=1.5 is not allowed"),
    (["rollout_correction=token_mask", "rollout_correction.low=6.0"], "rollout_correction.low=6.0 is not allowed"),
    (["clip=sapo", "+clip.eps_high=0.3"], "clip.eps_high is not a setting of clip=sapo; allowed: tau_neg, tau_pos"),
    (["clip=clip_cov", "+clip.generator=1"],
     "clip.generator is not a setting of clip=clip_cov \\(it is set by the trainer"),
    (["kl.estimator=k3+"], "kl.estimator='k3\\+' is not allowed; allowed: abs, k1, k1_st, k2, k3, k3_iw, k3_st"),
])
def test_bad_settings_of_the_new_tricks_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(overrides))


NOT_IN_REVIEW = {t.name: (o.family, o.name) for o in all_options() for t in o.tricks if t.verdict == "not_in_review"}


# the asynchronous-RL tricks and their losses are not in the review either (tests/test_async.py,
# tests/test_clip_options.py, tests/test_adv_estimators.py,
# tests/test_loss_agg.py)
ASYNC_TRICKS = {"stale_rollouts", "mixed_staleness", "spread_staleness", "proximal_loglinear", "proximal_behaviour",
            "decoupled_ppo", "m2po", "dppo", "prime_rl_loss", "vespo", "luspo", "topr", "kimi15", "clamped_reinforce",
            "maxrl", "prompt_mean", "fp32_lm_head", "zero_variance_filter", "remax", "replay_buffer",
            "no_positive_resampling", "difficulty_curriculum"}


# nor the rejection masks, DRO, rollout IS, IPO and the advantage gate (tests/test_rejection.py,
# tests/test_clip_dro_ipo_rollout_is.py)
MASK_AND_LOSS_TRICKS = {"trust_region_mask", "dro_loss", "rollout_is_loss", "ipo_loss", "advantage_range_gate",
            "ref_update_interval"}


def test_the_tricks_outside_the_seed_review_are_registered_as_not_in_the_review():
    assert ASYNC_TRICKS | MASK_AND_LOSS_TRICKS <= set(NOT_IN_REVIEW)
    assert {"gspo", "gmpo", "kl_straight_through", "ref_sync"} <= set(NOT_IN_REVIEW)
    # (no count of the catalogue: a new trick adds an entry and nothing else; each one says where it is from)
    tricks = [t for o in all_options() for t in o.tricks if t.verdict == "not_in_review"]
    assert all(t.source and t.what for t in tricks), [t.name for t in tricks if not (t.source and t.what)]


@pytest.mark.parametrize("name", sorted(NOT_IN_REVIEW))
def test_named_tricks_not_in_review_compose_and_validate(name):
    cfg = compose([f"+trick={name}"])
    validate(cfg)
    family, chosen = NOT_IN_REVIEW[name]
    assert (cfg.tricks[name].family, cfg.tricks[name].option, cfg[family].name) == (family, chosen, chosen)
    estimator = {"kl_importance_weighted": "k3_iw", "kl_straight_through": "k3_st"}.get(name, "k3")
    assert cfg.kl.estimator == estimator


@pytest.mark.parametrize("preset, expected", [
    ("gspo", {"clip": "gspo", "loss_agg": "seq_mean_token_mean", "kl": "none", "dual_clip": "none"}),
    ("cispo", {"clip": "cispo", "loss_agg": "token_mean", "kl": "none", "dual_clip": "none"}),
    ("scalerl", {"clip": "cispo_trl", "adv": "lite", "loss_agg": "token_mean", "kl": "none", "dual_clip": "none"}),
])
def test_new_presets(preset, expected):
    cfg = compose([f"preset={preset}"])
    validate(cfg)
    assert {family: cfg[family].name for family in expected} == expected
