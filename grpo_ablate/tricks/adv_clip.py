"""Family `adv_clip`: A <- clamp(A, -c, c), c = 2.0 (ROLL `advantage_clip`).

With G = 16 a lone success has A = 3.75 under adv=grpo, so c = 2 cuts exactly the
rare-success signal: the clipped fraction is logged so the report can show it.
"""
from __future__ import annotations

import torch


def no_adv_clip(advantages: torch.Tensor, **_):
    return advantages, torch.zeros((), dtype=advantages.dtype, device=advantages.device)


def clip_advantages(advantages: torch.Tensor, c: float = 2.0, **_):
    """Clamped advantages and the fraction of completions that were clamped."""
    clipped = advantages.clamp(-c, c)
    return clipped, (clipped != advantages).to(advantages.dtype).mean()


ADV_CLIPS = {"none": no_adv_clip, "clip": clip_advantages}
