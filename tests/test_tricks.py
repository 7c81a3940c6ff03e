"""The math of every trick against TRICKS.md's reference formulas and test vectors (float64)."""
import pytest
import torch

from grpo_ablate.tricks import option, options
from grpo_ablate.tricks.adv.group import group_mean_std
from grpo_ablate.tricks.clip.ratio import ppo_clip_loss
from grpo_ablate.tricks.kl import k1, k2, k3
from grpo_ablate.tricks.loss_agg import aggregate, masked_mean

D = torch.float64
REWARDS = torch.tensor([1, 0, 0, 0, 1, 1, 1, 0], dtype=D)   # two groups, G = 4
GROUPS = torch.arange(2).repeat_interleave(4)


def adv(name, rewards=REWARDS, groups=GROUPS, mask=None, values=None, components=None, **knobs):
    return option("adv", name).impl(rewards, groups, mask, values, components or {}, **knobs)


def impl(family, name):
    """The registered function (or class) of an option."""
    return option(family, name).impl


def token_weights(mask, mode, max_len=None):
    return impl("loss_agg", mode)(mask, max_len)


# ---------------------------------------------------------------- family adv
def test_grpo_vector():
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.5, 0.5, 0.5, -1.5], dtype=D)
    torch.testing.assert_close(adv("grpo", eps=1e-6), expected, atol=1e-5, rtol=0)


def test_dr_grpo_vector():
    expected = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75], dtype=D)
    torch.testing.assert_close(adv("dr_grpo"), expected)


def test_std_is_bessel_corrected_and_ragged_groups_work():
    rewards = torch.tensor([1.0, 3.0, 2.0, 2.0, 8.0], dtype=D)
    groups = torch.tensor([0, 0, 1, 1, 1])
    mean, std = group_mean_std(rewards, groups)
    torch.testing.assert_close(mean, torch.tensor([2, 2, 4, 4, 4], dtype=D))
    torch.testing.assert_close(std, torch.tensor([2 ** 0.5] * 2 + [12 ** 0.5] * 3, dtype=D))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo"])
def test_equal_rewards_give_zero_advantage(name):
    rewards = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0], dtype=D)
    assert torch.equal(adv(name, rewards), torch.zeros(8, dtype=D))


def test_lone_success_in_group_of_16():
    # TRICKS.md (adv_clip note): with G=16 a lone success has A = 3.75 under grpo
    rewards = torch.zeros(16, dtype=D)
    rewards[0] = 1
    a = adv("grpo", rewards, torch.zeros(16, dtype=torch.long), eps=1e-6)
    assert a[0].item() == pytest.approx(3.75, abs=1e-4)


# ---------------------------------------------------------------- family loss_agg
MASK = torch.zeros(2, 8, dtype=D)
MASK[0, :4] = 1
MASK[1, :7] = 1   # lengths 4 and 7, L_max = 8


@pytest.mark.parametrize("mode, w0, w1", [
    ("seq_mean_token_mean", 1 / 8, 1 / 14),
    ("token_mean", 1 / 11, 1 / 11),
    ("seq_mean_token_sum", 1 / 2, 1 / 2),
    ("constant", 1 / 16, 1 / 16),
])
def test_loss_agg_weights_vector(mode, w0, w1):
    w = token_weights(MASK, mode, max_len=8)
    assert torch.allclose(w[0, :4], torch.full((4,), w0, dtype=D))
    assert torch.allclose(w[1, :7], torch.full((7,), w1, dtype=D))
    assert torch.all(w[MASK == 0] == 0)


@pytest.mark.parametrize("mode", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "constant"])
def test_all_masked_batch_gives_zero_loss_not_nan(mode):
    mask = torch.zeros(3, 5, dtype=D)
    loss = aggregate(torch.randn(3, 5, dtype=D), token_weights(mask, mode, max_len=5))
    assert loss.item() == 0.0


def test_fully_masked_sequence_is_left_out_of_seq_means():
    mask = MASK.clone()
    mask = torch.cat([mask, torch.zeros(1, 8, dtype=D)])  # a third, fully masked sequence
    w = token_weights(mask, "seq_mean_token_mean", max_len=8)
    assert w[0, 0].item() == pytest.approx(1 / 8)          # B is still 2
    assert token_weights(mask, "seq_mean_token_sum")[1, 0].item() == pytest.approx(1 / 2)


@pytest.mark.parametrize("mode", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "constant"])
def test_micro_batches_add_up_to_the_full_batch_loss(mode):
    torch.manual_seed(0)
    mask = (torch.rand(6, 9) > 0.3).to(D)
    values = torch.randn(6, 9, dtype=D)
    w = token_weights(mask, mode, max_len=9)
    full = aggregate(values, w)
    parts = sum(aggregate(values[i:i + 2], w[i:i + 2]) for i in range(0, 6, 2))
    torch.testing.assert_close(parts, full)


def test_token_mean_counts_tokens_globally_not_per_micro_batch():
    w = token_weights(MASK, "token_mean")
    per_micro = [token_weights(MASK[i:i + 1], "token_mean") for i in range(2)]
    assert not torch.allclose(torch.cat(per_micro), w)   # the naive per-micro-batch version differs


def test_unknown_mode_names_the_allowed_ones():
    with pytest.raises(LookupError, match="token_mean"):
        token_weights(MASK, "nope")


# ---------------------------------------------------------------- family clip
def test_ppo_clip_values_and_gradients():
    old = torch.zeros(4, dtype=D)
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.9], dtype=D)
    a = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=D)
    logp = torch.log(ratios).requires_grad_(True)
    loss, stats = ppo_clip_loss(logp, old, a, torch.ones_like(logp), eps_low=0.2, eps_high=0.2)
    # 1.5 with A>0 clips to 1.2; 0.5 with A<0 clips to 0.8; the others are inside the band
    torch.testing.assert_close(loss, torch.tensor([-1.2, 0.8, -1.1, 0.9], dtype=D))
    loss.sum().backward()
    # clipped tokens get no gradient; unclipped: d(-rho A)/dlogp = -rho A
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 0.0, -1.1, 0.9], dtype=D))
    assert stats["clip/high_frac"].tolist() == [1, 0, 0, 0]
    assert stats["clip/low_frac"].tolist() == [0, 1, 0, 0]


def test_ppo_clip_pessimistic_side_is_not_clipped():
    # rho > 1 + eps with A < 0: min picks the unclipped (more negative) term, gradient flows
    logp = torch.log(torch.tensor([1.5], dtype=D)).requires_grad_(True)
    loss, stats = ppo_clip_loss(logp, torch.zeros(1, dtype=D), torch.tensor([-1.0], dtype=D),
                                torch.ones_like(logp))
    assert loss.item() == pytest.approx(1.5)
    loss.backward()
    assert logp.grad.item() == pytest.approx(1.5)
    assert stats["clip/low_frac"].item() == 0 and stats["clip/high_frac"].item() == 0


def test_on_policy_ratio_is_one_and_gradient_is_policy_gradient():
    logp = torch.tensor([-0.3, -2.0], dtype=D, requires_grad=True)
    a = torch.tensor([2.0, -1.0], dtype=D)
    loss, stats = ppo_clip_loss(logp, logp.detach(), a, torch.ones_like(logp))
    torch.testing.assert_close(loss, -a)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -a)   # d(-rho A)/dlogp at rho = 1 is -A
    assert stats["clip/low_frac"].sum() == 0 and stats["clip/high_frac"].sum() == 0


def test_extreme_log_ratio_is_clamped_to_finite():
    logp = torch.tensor([100.0, -100.0], dtype=D)
    loss, _ = ppo_clip_loss(logp, torch.zeros(2, dtype=D), torch.tensor([-1.0, 1.0], dtype=D),
                            torch.ones_like(logp))
    assert torch.isfinite(loss).all()


# ---------------------------------------------------------------- family kl
def test_kl_estimator_values():
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=D)
    ref = torch.tensor([-1.5, -1.0, -0.5], dtype=D)
    log_r = ref - logp
    torch.testing.assert_close(k1(logp, ref), -log_r)
    torch.testing.assert_close(k2(logp, ref), 0.5 * log_r ** 2)
    torch.testing.assert_close(k3(logp, ref), torch.exp(log_r) - 1 - log_r)
    assert (k3(logp, ref) >= 0).all() and k3(logp, ref)[2] == 0
    assert torch.isfinite(k3(torch.tensor([0.0], dtype=D), torch.tensor([-1e4], dtype=D))).all()


def _expected_gradient(estimator, logits, ref_logp):
    """E_{x ~ pi_theta}[grad estimator(x)], exactly, over a small vocabulary (on-policy)."""
    logits = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(logits, dim=-1)
    weights = logp.exp().detach()
    (weights * estimator(logp, ref_logp)).sum().backward()
    return logits.grad


def test_kl_estimator_gradient_facts():
    torch.manual_seed(0)
    logits = torch.randn(7, dtype=D)
    ref_logp = torch.log_softmax(torch.randn(7, dtype=D), dim=-1)

    def grad_of(fn):
        x = logits.clone().requires_grad_(True)
        fn(torch.log_softmax(x, dim=-1)).backward()
        return x.grad

    reverse_kl = grad_of(lambda lp: (lp.exp() * (lp - ref_logp)).sum())        # KL(pi || ref)
    forward_kl = grad_of(lambda lp: (ref_logp.exp() * (ref_logp - lp)).sum())  # KL(ref || pi)
    # k1 as a loss has zero expected gradient; k2 gives the reverse-KL gradient; k3 the forward
    torch.testing.assert_close(_expected_gradient(k1, logits, ref_logp), torch.zeros(7, dtype=D))
    torch.testing.assert_close(_expected_gradient(k2, logits, ref_logp), reverse_kl)
    torch.testing.assert_close(_expected_gradient(k3, logits, ref_logp), forward_kl)
    assert {"k1", "k2", "k3"} <= set(options("kl.estimator"))


def test_masked_mean():
    values = torch.tensor([[1.0, 2.0, 100.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0]], dtype=D)
    assert masked_mean(values, mask).item() == 1.5
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0


# ---------------------------------------------------------------- family adv (the rest)
def test_lite_vector():
    # TRICKS.md: std_B = 0.5345 -> [1.4029, -0.4676, ... | 0.4676, ..., -1.4029] (4-digit rounding)
    expected = torch.tensor([1.4031, -0.4677, -0.4677, -0.4677, 0.4677, 0.4677, 0.4677, -1.4031], dtype=D)
    torch.testing.assert_close(adv("lite"), expected, atol=3e-4, rtol=0)
    assert REWARDS.std().item() == pytest.approx(0.5345, abs=1e-4)


def test_lite_std_of_centered():
    centred = adv("dr_grpo")
    torch.testing.assert_close(adv("lite", std_of="centered"), centred / (centred.std() + 1e-6))
    with pytest.raises(ValueError, match="raw, centered"):
        adv("lite", std_of="nope")


def test_batch_and_rloo_vectors():
    b = 0.5 / REWARDS.std()
    torch.testing.assert_close(adv("batch"), torch.tensor([1, -1, -1, -1, 1, 1, 1, -1], dtype=D) * b, atol=1e-5, rtol=0)
    third = 1 / 3
    torch.testing.assert_close(adv("rloo"), torch.tensor([1, -third, -third, -third, third, third, third, -1], dtype=D))


def test_rpp_baseline_vector_and_token_weighting():
    # TRICKS.md, equal lengths: [1.731, -0.577, ... | 0.577, ..., -1.731]
    expected = torch.tensor([1.731, -0.577, -0.577, -0.577, 0.577, 0.577, 0.577, -1.731], dtype=D)
    torch.testing.assert_close(adv("rpp_baseline", mask=torch.ones(8, 5, dtype=D)), expected, atol=2e-3, rtol=0)
    # unequal lengths: the whitening statistics are over tokens, so long completions weigh more
    mask = torch.ones(8, 5, dtype=D)
    mask[0, 1:] = 0
    a = adv("rpp_baseline", mask=mask)
    c = adv("dr_grpo")
    w = mask.sum(1)
    mu = (w * c).sum() / w.sum()
    torch.testing.assert_close(a, (c - mu) / torch.sqrt((w * (c - mu) ** 2).sum() / w.sum() + 1e-8))
    assert (w * a).sum().abs() < 1e-9          # zero token-mean


def test_global_reward_norm_algebra():
    """global-then-grpo equals grpo up to eps; global-then-dr_grpo equals lite."""
    normed = impl("reward_norm", "batch")(REWARDS, eps=0.0)
    torch.testing.assert_close(adv("grpo", normed, eps=1e-9), adv("grpo", eps=1e-9), atol=1e-6, rtol=0)
    torch.testing.assert_close(adv("dr_grpo", normed), adv("lite", eps=0.0))
    assert torch.equal(impl("reward_norm", "none")(REWARDS), REWARDS)


def test_adv_clip_cuts_the_lone_success():
    rewards = torch.zeros(16, dtype=D)
    rewards[0] = 1
    a = adv("grpo", rewards, torch.zeros(16, dtype=torch.long))
    clipped, frac = impl("adv_clip", "clip")(a, c=2.0)
    assert clipped[0].item() == 2.0 and torch.equal(clipped[1:], a[1:]) and frac.item() == 1 / 16
    same, zero = impl("adv_clip", "none")(a)
    assert torch.equal(same, a) and zero.item() == 0


# ---------------------------------------------------------------- family dual_clip
def test_dual_clip_values_and_zero_gradient_beyond_c():
    ratios = torch.tensor([5.0, 2.0, 0.5, 5.0], dtype=D)
    a = torch.tensor([-1.0, -1.0, -1.0, 1.0], dtype=D)
    logp = torch.log(ratios).requires_grad_(True)
    loss, stats = ppo_clip_loss(logp, torch.zeros(4, dtype=D), a, torch.ones_like(logp), eps_low=0.2, eps_high=0.2,
                                dual_clip_c=3.0)
    # rho=5, A<0: PPO loss 5, capped at c*|A| = 3, no gradient; rho=2, A<0: 2 < 3, unchanged;
    # rho=0.5, A<0: clipped at 0.8 by PPO; rho=5, A>0: clipped at 1.2, dual-clip does not apply
    torch.testing.assert_close(loss, torch.tensor([3.0, 2.0, 0.8, -1.2], dtype=D))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 2.0, 0.0, 0.0], dtype=D))
    assert stats["clip/dual_frac"].tolist() == [1, 0, 0, 0]
    plain, _ = ppo_clip_loss(torch.log(ratios), torch.zeros(4, dtype=D), a, torch.ones_like(torch.log(ratios)))
    assert plain[0].item() == pytest.approx(5.0)   # without dual-clip the loss is unbounded


def test_clip_higher_lets_positive_tokens_grow_further():
    logp = torch.log(torch.tensor([1.25], dtype=D)).requires_grad_(True)
    one = torch.ones(1, dtype=D)
    sym, _ = ppo_clip_loss(logp, torch.zeros(1, dtype=D), one, torch.ones_like(logp), eps_low=0.2, eps_high=0.2)
    higher, _ = ppo_clip_loss(logp, torch.zeros(1, dtype=D), one, torch.ones_like(logp), eps_low=0.2, eps_high=0.28)
    assert sym.item() == pytest.approx(-1.2) and higher.item() == pytest.approx(-1.25)


# ---------------------------------------------------------------- family overlong
def test_soft_overlong_penalty_vector():
    from grpo_ablate.tricks.overlong import soft_overlong_penalty
    lengths = torch.tensor([100.0, 16384.0, 18432.0, 20480.0, 30000.0], dtype=D)
    got = soft_overlong_penalty(lengths, max_len=20480, buffer=4096, factor=1.0)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0], dtype=D))


def test_overlong_soft_punish_adds_to_the_reward():
    rewards = torch.tensor([1.0, 1.0, 0.0], dtype=D)
    lengths = torch.tensor([4.0, 7.0, 8.0], dtype=D)
    truncated = torch.tensor([False, False, True])
    one_group = torch.zeros(3, dtype=torch.long)
    shaped, keep, penalty = impl("overlong", "soft_punish")(rewards, lengths, truncated, one_group, truncated, 8,
                                                            buffer=4, factor=1.0)
    torch.testing.assert_close(penalty, torch.tensor([0.0, -0.75, -1.0], dtype=D))
    torch.testing.assert_close(shaped, rewards + penalty)
    assert keep.all()


def test_overlong_filter_zero_gradient_but_still_in_the_group_mean():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=D)
    truncated = torch.tensor([False, False, True, False])
    lengths = torch.tensor([3.0, 3.0, 4.0, 2.0], dtype=D)
    shaped, keep, _ = impl("overlong", "filter")(rewards, lengths, truncated, torch.zeros(4, dtype=torch.long),
                                                 truncated, 4)
    assert torch.equal(shaped, rewards) and keep.tolist() == [True, True, False, True]
    groups = torch.zeros(4, dtype=torch.long)
    a = adv("grpo", shaped, groups)
    # the truncated completion's reward (0) still counts: the mean is 0.5, not 2/3
    assert a[0].item() == pytest.approx(0.5 / shaped.std().item(), rel=1e-5)
    mask = torch.ones(4, 4, dtype=D) * keep[:, None]
    logp = torch.full((4, 4), -1.0, dtype=D, requires_grad=True)
    loss, _ = ppo_clip_loss(logp, logp.detach(), a[:, None], torch.ones_like(logp))
    aggregate(loss, token_weights(mask, "token_mean")).backward()
    assert torch.all(logp.grad[2] == 0) and torch.all(logp.grad[0] != 0)
    assert token_weights(mask, "token_mean")[0, 0].item() == pytest.approx(1 / 12)  # 12 kept tokens


# ---------------------------------------------------------------- family length
def test_length_penalty_and_group_reward():
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0], dtype=D)
    lengths = torch.tensor([2.0, 4.0, 6.0, 6.0, 5.0, 5.0], dtype=D)
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    correct = rewards > 0
    shaped, bonus = impl("length", "penalty")(rewards, lengths, groups, correct, 10, lam=0.1)
    torch.testing.assert_close(bonus, -0.1 * lengths / 10)
    shaped, bonus = impl("length", "group")(rewards, lengths, groups, correct, 10, weight=1.0)
    # group 0: lam = 0.5 - (len - 2)/4 = [0.5, 0, -0.5, -0.5]; wrong answers never gain;
    # group 1: equal lengths -> 0
    torch.testing.assert_close(bonus, torch.tensor([0.5, 0.0, -0.5, -0.5, 0.0, 0.0], dtype=D))
    torch.testing.assert_close(shaped, rewards + bonus)
    short_wrong = impl("length", "group")(torch.zeros(2, dtype=D), torch.tensor([1.0, 3.0], dtype=D),
                                          torch.zeros(2, dtype=torch.long), torch.tensor([False, False]), 10)[1]
    torch.testing.assert_close(short_wrong, torch.tensor([0.0, -0.5], dtype=D))


# ---------------------------------------------------------------- controllers
def test_adaptive_entropy_coefficient():
    ctl = impl("entropy", "adaptive")(coef=0.0, target=0.2, delta=0.005, coef_min=0.0, coef_max=0.01)
    assert ctl.coef == 0.0
    coefs = []
    for h in (0.1, 0.1, 0.1, 0.5, 0.1):
        ctl.update(h)
        coefs.append(round(ctl.coef, 6))
    # rises while H <= target (capped at coef_max); off (and falling) while H > target
    assert coefs == [0.005, 0.01, 0.01, 0.0, 0.01]
    assert impl("entropy", "none")(coef=0.0).coef == 0.0


def test_kl_controllers():
    th = impl("kl", "adaptive")(beta=0.04, threshold=0.02, growth=0.1, beta_max=0.05)
    betas = []
    for kl in (0.01, 0.03, 0.03, 0.03, 0.01):
        th.update(kl, 64)
        betas.append(round(th.beta, 6))
    assert betas == [0.04, 0.044, 0.0484, 0.05, 0.05]     # rises only above the threshold, capped
    target = impl("kl", "adaptive_target")(beta=0.04, target=0.02, horizon=10000)
    target.update(0.1, 100)       # KL 5x the target: error clipped at +0.2
    assert target.beta == pytest.approx(0.04 * (1 + 0.2 * 100 / 10000))
    target.update(0.015, 100)     # error -0.25 clipped at -0.2
    assert target.beta == pytest.approx(0.04 * (1 + 0.2 * 0.01) * (1 - 0.2 * 0.01))
    state = target.state_dict()
    again = impl("kl", "adaptive_target")(beta=1.0)
    again.load_state_dict(state)
    assert again.beta == target.beta


# ---------------------------------------------------------------- family temperature
def test_learnable_temperature_gets_a_gradient_and_moves():
    temp = impl("temperature", "learnable")(value=1.0, lr=0.1, t_min=0.5, t_max=2.0)
    torch.manual_seed(0)
    logits = torch.randn(6, 5, dtype=D)
    tokens = torch.tensor([0, 1, 2, 3, 4, 0])
    adv_ = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0], dtype=D)
    opt = torch.optim.AdamW(temp.param_groups())
    logp = torch.log_softmax(logits / temp.current().to(D), -1).gather(1, tokens[:, None]).squeeze(1)
    loss, _ = ppo_clip_loss(logp, logp.detach(), adv_, torch.ones_like(logp))
    loss.mean().backward()
    assert temp.log_t.grad is not None and temp.log_t.grad.abs().item() > 0
    before = temp.value
    opt.step()
    assert temp.value != before and 0.5 <= temp.value <= 2.0
    state = temp.state_dict()
    other = impl("temperature", "learnable")(value=1.5)
    other.load_state_dict(state)
    assert other.value == pytest.approx(temp.value)
    assert impl("temperature", "fixed")(value=0.7).current() == 0.7


# ---------------------------------------------------------------- family kl_weight
def test_kl_weights():
    mask = torch.ones(2, 6, dtype=D)
    entropy = torch.tensor([[1.0, 1, 1, 1, 1, 1], [3, 3, 3, 3, 3, 3]], dtype=D)
    assert torch.equal(impl("kl_weight", "uniform")(mask, entropy), torch.ones(2, 6, dtype=D))
    w = impl("kl_weight", "length_budget")(mask, entropy, budget=2, alpha=1.0)
    torch.testing.assert_close(w[0], torch.tensor([1, 1, 1, 1.5, 2, 2.5], dtype=D))
    e = impl("kl_weight", "entropy")(mask, entropy)
    torch.testing.assert_close(e, entropy / 2, atol=1e-7, rtol=0)   # mean 1 over the batch
    assert (e * mask).sum() / mask.sum() == pytest.approx(1.0)


def test_kl_in_reward_controller_and_penalty():
    from grpo_ablate.tricks.kl import kl_reward_penalty
    in_reward = impl("kl", "in_reward")(beta=0.1)
    fixed = impl("kl", "fixed")(beta=0.1)
    assert (in_reward.loss_beta, in_reward.reward_beta) == (0.0, 0.1)
    assert (fixed.loss_beta, fixed.reward_beta) == (0.1, 0.0)
    old = torch.tensor([[-1.0, -2.0, -3.0]], dtype=D)
    ref = torch.tensor([[-1.5, -1.0, -9.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=D)
    torch.testing.assert_close(kl_reward_penalty(old, ref, mask), torch.tensor([0.5 - 1.0], dtype=D))


# ---------------------------------------------------------------- adv=gae and value_clip
def test_gae_with_gamma_lambda_one_is_return_minus_value():
    from grpo_ablate.tricks.adv.critic import gae, token_rewards
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=D)
    rewards = torch.tensor([1.0, 0.0], dtype=D)
    values = torch.tensor([[0.2, 0.5, 0.9, 7.0], [0.1, -0.3, 7.0, 7.0]], dtype=D)
    tr = token_rewards(rewards, mask)
    torch.testing.assert_close(tr, torch.tensor([[0, 0, 1, 0], [0, 0, 0, 0]], dtype=D))
    adv_, ret = gae(tr, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(adv_, (rewards[:, None] - values) * mask)
    torch.testing.assert_close(ret, rewards[:, None] * mask)


def test_gae_discounted_by_hand():
    from grpo_ablate.tricks.adv.critic import gae
    mask = torch.ones(1, 2, dtype=D)
    r = torch.tensor([[0.0, 1.0]], dtype=D)
    v = torch.tensor([[0.5, 0.25]], dtype=D)
    adv_, ret = gae(r, v, mask, gamma=0.9, lam=0.5)
    d1 = 1.0 - 0.25                      # last token: r + 0 - V
    d0 = 0.0 + 0.9 * 0.25 - 0.5
    torch.testing.assert_close(adv_, torch.tensor([[d0 + 0.45 * d1, d1]], dtype=D))
    torch.testing.assert_close(ret, adv_ + v)


def test_gae_estimator_whitens_over_tokens():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=D)
    values = torch.tensor([[0.2, 0.5, 0.9], [0.1, -0.3, 0.0]], dtype=D)
    a = impl("adv", "gae")(torch.tensor([1.0, 0.0], dtype=D), None, mask, values, {})
    assert option("adv", "gae").uses_values and not option("adv", "gae").uses_group_statistic
    assert (a * mask).sum().abs() < 1e-9 and ((a * mask) ** 2).sum() / mask.sum() == pytest.approx(1.0, abs=1e-6)
    assert a[1, 2] == 0


def test_value_losses_and_explained_variance():
    from grpo_ablate.tricks.value_clip import explained_variance
    values = torch.tensor([1.0, 0.0], dtype=D)
    old = torch.tensor([0.5, 0.5], dtype=D)
    ret = torch.tensor([0.0, 0.0], dtype=D)
    torch.testing.assert_close(impl("value_clip", "none")(values, old, ret), torch.tensor([0.5, 0.0], dtype=D))
    # clipped: V_old + clip(V - V_old, -0.2, 0.2) = [0.7, 0.3]; loss = 0.5 max(unclipped^2, clipped^2)
    torch.testing.assert_close(impl("value_clip", "clip")(values, old, ret, eps=0.2),
                               torch.tensor([0.5, 0.5 * 0.09], dtype=D))
    mask = torch.ones(4, dtype=D)
    r = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=D)
    assert explained_variance(r, r, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.full_like(r, 2.5), r, mask).item() == pytest.approx(0.0)


# ---------------------------------------------------------------- the registry
def test_registry_refuses_a_duplicate_name_and_a_different_calling_convention():
    from grpo_ablate.tricks.registry import register

    with pytest.raises(ValueError, match="adv=grpo is registered twice"):
        register("adv", "grpo")(lambda rewards, group_index, mask, values: rewards)
    with pytest.raises(TypeError, match=r"takes \(rewards\), but the family's options take"):
        register("adv", "odd_one")(lambda rewards: rewards)
    assert "odd_one" not in options("adv")


def test_registry_miss_lists_the_allowed_names_and_bind_checks_knobs():
    with pytest.raises(LookupError, match="adv=nope is not allowed; allowed: batch, dr_grpo, gae, gdpo, gdpo_trl, gpg"):
        option("adv", "nope")
    assert option("overlong", "soft_punish").knobs == {"buffer": 4096, "factor": 1.0, "gamma": 0.0,
                                                      "failure_scale": 1.0}
    with pytest.raises(TypeError, match="overlong=soft_punish has no option bufer; allowed: buffer, factor"):
        option("overlong", "soft_punish").bind({"bufer": 3})
    bound = option("reward_norm", "batch").bind({"eps": 0.0})
    torch.testing.assert_close(bound(REWARDS), impl("reward_norm", "batch")(REWARDS, eps=0.0))


@pytest.mark.full
def test_every_family_yaml_sets_only_knobs_of_its_option():
    """conf/<family>/<option>.yaml: every key is a knob of the registered option (or a key the
    trainer reads), so a YAML typo fails here, not in a user's run."""
    from grpo_ablate.config.compose import compose
    from grpo_ablate.config.validate import check_family_keys, trick_families
    from grpo_ablate.tricks import families

    # one composition per option index, every family's i-th option at once (a family's YAML
    # writes only its own group): ~20 compositions instead of one per option (~140)
    columns = {family: list(options(family)) for family in trick_families()}
    for i in range(max(len(names) for names in columns.values())):
        chosen = {family: names[i] for family, names in columns.items() if i < len(names)}
        cfg = compose([f"{family}={name}" for family, name in chosen.items()])
        for family, name in chosen.items():
            assert cfg[family].name == name, (family, name)
            check_family_keys(cfg, family)
    assert set(trick_families()) >= {f for f in families() if "." not in f}
