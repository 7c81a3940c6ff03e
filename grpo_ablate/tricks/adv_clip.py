"""Family `adv_clip`: A <- clamp(A, -c, c), c = 2.0 (ROLL `advantage_clip`).

With G = 16 a lone success has A = 3.75 under adv=grpo, so c = 2 cuts exactly the
rare-success signal: the clipped fraction is logged so the report can show it.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.conditions import grpo_cannot_reach
from grpo_ablate.tricks.registry import POSITIVE, Activity, Inert, Trick, declare_family, register

declare_family("adv_clip", "clamp advantages to ±c", stage="advantage", metric="adv/clipped_frac")


@register("adv_clip", "none")
def no_adv_clip(advantages: torch.Tensor):
    return advantages, torch.zeros((), dtype=advantages.dtype, device=advantages.device)


@register("adv_clip", "clip",
          what="A <- clamp(A, -c, c) (ROLL advantage_clip); with G=16 a lone success has A=3.75 under grpo",
          knobs={"c": POSITIVE},
          activity=Activity("adv/clipped_frac"),
          inert=Inert(grpo_cannot_reach, "cannot act: with adv=grpo on unshaped 0/1 rewards no |A| exceeds "
                      "(G-1)/sqrt(G), below adv_clip.c",
                      "lower adv_clip.c, raise rollout.group_size, or shape the reward",
                      "advantages beyond adv_clip.c"),
          tricks=(Trick("adv_clip",
                        what="clamp advantages to +-2",
                        source="ROLL advantage_clip",
                        verdict="not_applicable"),))
def clip_advantages(advantages: torch.Tensor, *, c: float = 2.0):
    """Clamped advantages and the fraction of completions that were clamped."""
    clipped = advantages.clamp(-c, c)
    return clipped, (clipped != advantages).to(advantages.dtype).mean()

