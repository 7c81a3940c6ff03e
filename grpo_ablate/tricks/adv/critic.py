"""Family `adv`, PPO with a critic (`gae`): a value head's per-token values, GAE over the token rewards,
per-token advantages; the critic's own loss is the family `value_clip` (tricks/value_clip.py).
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import FLAG, FRACTION, Trick, register


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


@register("adv", "gae",
          what="PPO with a critic: a value head on the policy, GAE over token rewards, whitened",
          notes={"value_coef": "weight of the value loss in the total loss"},
          uses_group_statistic=False, uses_values=True,
          knobs={"gamma": FRACTION, "lam": FRACTION, "whiten": FLAG},
          writes=("adv/std", "value/explained_variance"),
          tricks=(Trick("critic_gae",
                        what="PPO with a critic: value head, GAE advantages per token",
                        source="verl adv_estimator=gae",
                        verdict="not_applicable",
                        cost="a value head and its loss; pi_old forward each step for V_old"),))
def gae_advantage(rewards, group_index, mask, values, components, *, gamma: float = 1.0, lam: float = 1.0,
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
