"""Family `clip`: the PPO clipped surrogate, per token.

loss_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t),  rho_t = exp(logp - old_logp)

`symmetric`: eps_low = eps_high = 0.2. `higher` (DAPO clip-higher) raises eps_high to 0.28.
Reference: verl core_algos `compute_policy_loss_vanilla` (clip_ratio_low / clip_ratio_high);
TRL `_compute_loss` (epsilon_low / epsilon_high). log rho is clamped to [-20, 20] before exp.
With one update per rollout rho == 1, nothing clips and the fractions are 0: expected.

Family `dual_clip` (`dual_clip_c`, verl `clip_ratio_c`, default 3; DAPO's script uses 10):
for A < 0 the objective becomes max(min(rho A, clip(rho) A), c A), i.e. the loss is capped
at -c A, so a token with rho > c and A < 0 gets no gradient.
"""
from __future__ import annotations

import torch

from grpo_ablate.tricks.registry import register

LOG_RATIO_LIMIT = 20.0


@register("clip", "symmetric")
@register("clip", "higher")
def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, *,
                  eps_low: float = 0.2, eps_high: float = 0.2, dual_clip_c: float | None = None):
    """Per-token clipped policy loss and per-token clip indicators (floats, for metrics).

    `advantages` broadcasts against logp ([B, 1] per sequence or [B, T] per token).
    """
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        # a token is "clipped" when the clamp is the active branch of the min
        low = ((ratio < 1.0 - eps_low) & (advantages < 0)).to(logp.dtype)
        high = ((ratio > 1.0 + eps_high) & (advantages > 0)).to(logp.dtype)
        dual = torch.zeros_like(low)
    if dual_clip_c is not None:
        capped = torch.minimum(loss, -dual_clip_c * advantages)   # max(obj, c A) as a loss
        negative = advantages < 0
        with torch.no_grad():
            dual = (negative & (capped < loss)).to(logp.dtype)
        loss = torch.where(negative, capped, loss)
    return loss, {"clip/low_frac": low, "clip/high_frac": high, "clip/dual_frac": dual}

