"""Family `adv`: advantage estimators, r (one scalar per completion) -> A (one per completion).

Groups are given as `group_index` (completion j belongs to prompt group_index[j]), which also
covers ragged groups. Every estimator returns A of the same shape as r; the trainer
broadcasts A over the completion's tokens. std is Bessel-corrected (N-1), as in TRL, verl
and ROLL.
"""
from __future__ import annotations

import torch

from grpo_ablate.tricks.registry import register

# Every estimator takes (rewards [N], group_index [N], mask [N, T], values [N, T] or None) and
# returns A: [N] per completion, or [N, T] per token for an estimator with a critic. Flags:
#   uses_group_statistic  needs G >= 2 completions per prompt to mean anything
#   uses_values           needs a critic: per-token values in, per-token advantages out


def group_mean_std(values: torch.Tensor, group_index: torch.Tensor):
    """Per-completion mean and Bessel-corrected std of its group (0 std for a group of one)."""
    n_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    count = torch.zeros(n_groups, dtype=values.dtype, device=values.device)
    count.index_add_(0, group_index, torch.ones_like(values))
    total = torch.zeros_like(count).index_add_(0, group_index, values)
    mean = (total / count)[group_index]
    sq = torch.zeros_like(count).index_add_(0, group_index, (values - mean) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))[group_index]
    return mean, std


@register("adv", "grpo", uses_group_statistic=True)
def grpo_advantage(rewards, group_index, mask, values, *, eps: float = 1e-6):
    """A_j = (r_j - mean_g r) / (std_g r + eps).

    Reference: TRL grpo_trainer `_generate_and_score_completions` with scale_rewards="group";
    verl core_algos `compute_grpo_outcome_advantage` (adv_estimator=grpo). eps defaults to
    verl/ROLL's 1e-6 (TRL uses 1e-4). A group whose rewards are all equal gets A = 0.
    """
    mean, std = group_mean_std(rewards, group_index)
    return (rewards - mean) / (std + eps)


def batch_std(values: torch.Tensor) -> torch.Tensor:
    """Bessel-corrected std over the whole batch of the optimizer step (0 for one value)."""
    return values.std() if values.numel() > 1 else torch.zeros((), dtype=values.dtype, device=values.device)


@register("adv", "dr_grpo", uses_group_statistic=True)
def dr_grpo_advantage(rewards, group_index, mask, values):
    """A_j = r_j - mean_g r (no division by the group std).

    Reference: Dr. GRPO (arXiv 2503.20783); TRL scale_rewards="none"; verl
    norm_adv_by_std_in_grpo=False.
    """
    mean, _ = group_mean_std(rewards, group_index)
    return rewards - mean


@register("adv", "lite", uses_group_statistic=True)
def lite_advantage(rewards, group_index, mask, values, *, eps: float = 1e-6, std_of: str = "raw"):
    """Lite PPO: A_j = (r_j - mean_g r) / (std_B + eps): group mean, batch std.

    Reference: Tricks or Traps (arXiv 2508.08221); ROLL `compute_advantage` with
    norm_mean_type=group, norm_std_type=batch; TRL scale_rewards="batch". std_B is taken of
    the raw rewards (`std_of: raw`, ROLL today) or of the group-centred ones (`centered`, old
    ROLL).
    """
    if std_of not in ("raw", "centered"):
        raise ValueError(f"adv.std_of={std_of!r} is not allowed; allowed: raw, centered")
    mean, _ = group_mean_std(rewards, group_index)
    centred = rewards - mean
    return centred / (batch_std(rewards if std_of == "raw" else centred) + eps)


@register("adv", "batch", uses_group_statistic=True)
def batch_advantage(rewards, group_index, mask, values, *, eps: float = 1e-6):
    """Global normalization: A_j = (r_j - mean_B r) / (std_B r + eps).

    Reference: ROLL `compute_advantage` with norm_mean_type=batch, norm_std_type=batch.
    """
    return (rewards - rewards.mean()) / (batch_std(rewards) + eps)


@register("adv", "rloo", uses_group_statistic=True)
def rloo_advantage(rewards, group_index, mask, values):
    """RLOO: A_j = r_j - (sum_{k != j} r_k) / (G - 1), the leave-one-out group mean.

    Reference: verl core_algos `compute_rloo_outcome_advantage` (adv_estimator=rloo).
    Equals G/(G-1) * (r_j - mean_g r).
    """
    mean, _ = group_mean_std(rewards, group_index)
    count = torch.bincount(group_index).to(rewards.dtype)[group_index]
    return (rewards - mean) * count / (count - 1).clamp(min=1)


@register("adv", "rpp_baseline", uses_group_statistic=True)
def rpp_baseline_advantage(rewards, group_index, mask, values, *, eps: float = 1e-8):
    """REINFORCE++-baseline: c_j = r_j - mean_g r, then whitened over all completion tokens
    of the batch: (c - mean_tok c) / sqrt(var_tok c + eps).

    Reference: verl core_algos `compute_reinforce_plus_plus_baseline_outcome_advantage`
    (adv_estimator=reinforce_plus_plus_baseline). Token statistics weight each completion by
    its token count (`mask`; equal weights without one); the variance is the population
    variance over tokens (verl's `masked_whiten` applies Bessel's correction over tokens,
    which differs by a factor (N-1)/N that vanishes with many tokens).
    """
    mean, _ = group_mean_std(rewards, group_index)
    centred = rewards - mean
    weight = (mask.sum(dim=1).to(rewards.dtype) if mask is not None else torch.ones_like(rewards))
    total = weight.sum().clamp(min=1)
    token_mean = (weight * centred).sum() / total
    token_var = (weight * (centred - token_mean) ** 2).sum() / total
    return (centred - token_mean) / torch.sqrt(token_var + eps)


def token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """An outcome reward placed on the last trained token of each completion."""
    out = torch.zeros_like(mask, dtype=rewards.dtype)
    last = (mask.sum(dim=1).long() - 1).clamp(min=0)
    out[torch.arange(mask.shape[0]), last] = rewards * (mask.sum(dim=1) > 0).to(rewards.dtype)
    return out


def gae(token_reward: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 1.0):
    """Generalized advantage estimation over completion tokens: (advantages, returns) [N, L].

    delta_t = r_t + gamma V_{t+1} - V_t (V after the last token is 0); A_t = sum_k (gamma lam)^k
    delta_{t+k}; returns = A + V. Reference: verl core_algos `compute_gae_advantage_return`.
    """
    values = values * mask
    advantages = torch.zeros_like(values)
    running = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    for t in reversed(range(values.shape[1])):
        next_value = values[:, t + 1] if t + 1 < values.shape[1] else torch.zeros_like(running)
        delta = token_reward[:, t] + gamma * next_value - values[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


@register("adv", "gae", uses_group_statistic=False, uses_values=True)
def gae_advantage(rewards, group_index, mask, values, *, gamma: float = 1.0, lam: float = 1.0,
                  whiten: bool = True):
    """PPO with a critic: GAE over token rewards (the outcome reward on the last token), then
    whitened over the batch's completion tokens as verl does (`whiten: true`). gamma = lam = 1
    by default, so A_t = R - V_t."""
    advantages, _ = gae(token_rewards(rewards, mask), values, mask, gamma, lam)
    if not whiten:
        return advantages
    n = mask.sum().clamp(min=1)
    mean = (advantages * mask).sum() / n
    var = (((advantages - mean) * mask) ** 2).sum() / n
    return (advantages - mean) * torch.rsqrt(var + 1e-8) * mask
