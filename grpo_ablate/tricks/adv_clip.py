"""Family `adv_clip`: A <- clamp(A, -c, c), c = 2.0 (ROLL `advantage_clip`).

With G = 16 a lone success has A = 3.75 under adv=grpo, so c = 2 cuts exactly the
rare-success signal: the clipped fraction is logged so the report can show it.
"""
from __future__ import annotations

import torch

from grpo_ablate.tricks.registry import register


@register("adv_clip", "none")
def no_adv_clip(advantages: torch.Tensor):
    return advantages, torch.zeros((), dtype=advantages.dtype, device=advantages.device)


@register("adv_clip", "clip")
def clip_advantages(advantages: torch.Tensor, *, c: float = 2.0):
    """Clamped advantages and the fraction of completions that were clamped."""
    clipped = advantages.clamp(-c, c)
    return clipped, (clipped != advantages).to(advantages.dtype).mean()

