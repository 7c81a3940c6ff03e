"""The math of every trick against TRICKS.md's reference formulas and test vectors (float64)."""
import pytest
import torch

from grpo_ablate.tricks.adv import ADV_ESTIMATORS, group_mean_std
from grpo_ablate.tricks.clip import ppo_clip_loss
from grpo_ablate.tricks.kl import KL_ESTIMATORS, k1, k2, k3
from grpo_ablate.tricks.loss_agg import aggregate, masked_mean, token_weights

D = torch.float64
REWARDS = torch.tensor([1, 0, 0, 0, 1, 1, 1, 0], dtype=D)   # two groups, G = 4
GROUPS = torch.arange(2).repeat_interleave(4)


def adv(name, rewards=REWARDS, groups=GROUPS, **kw):
    return ADV_ESTIMATORS[name].fn(rewards, groups, **kw)


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
    with pytest.raises(ValueError, match="token_mean"):
        token_weights(MASK, "nope")


# ---------------------------------------------------------------- family clip
def test_ppo_clip_values_and_gradients():
    old = torch.zeros(4, dtype=D)
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.9], dtype=D)
    a = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=D)
    logp = torch.log(ratios).requires_grad_(True)
    loss, stats = ppo_clip_loss(logp, old, a, eps_low=0.2, eps_high=0.2)
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
    loss, stats = ppo_clip_loss(logp, torch.zeros(1, dtype=D), torch.tensor([-1.0], dtype=D))
    assert loss.item() == pytest.approx(1.5)
    loss.backward()
    assert logp.grad.item() == pytest.approx(1.5)
    assert stats["clip/low_frac"].item() == 0 and stats["clip/high_frac"].item() == 0


def test_on_policy_ratio_is_one_and_gradient_is_policy_gradient():
    logp = torch.tensor([-0.3, -2.0], dtype=D, requires_grad=True)
    a = torch.tensor([2.0, -1.0], dtype=D)
    loss, stats = ppo_clip_loss(logp, logp.detach(), a)
    torch.testing.assert_close(loss, -a)
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, -a)   # d(-rho A)/dlogp at rho = 1 is -A
    assert stats["clip/low_frac"].sum() == 0 and stats["clip/high_frac"].sum() == 0


def test_extreme_log_ratio_is_clamped_to_finite():
    logp = torch.tensor([100.0, -100.0], dtype=D)
    loss, _ = ppo_clip_loss(logp, torch.zeros(2, dtype=D), torch.tensor([-1.0, 1.0], dtype=D))
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
    assert set(KL_ESTIMATORS) == {"k1", "k2", "k3"}


def test_masked_mean():
    values = torch.tensor([[1.0, 2.0, 100.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0]], dtype=D)
    assert masked_mean(values, mask).item() == 1.5
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0
