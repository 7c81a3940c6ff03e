"""Family `value_clip`: the critic's loss, which exists only with a critic (adv=gae).

`none`: 0.5 (V - R)^2 per token. `clip` (PPO value clipping, eps_v = 0.2):
0.5 max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2).
Reference: verl core_algos `compute_value_loss` (cliprange_value). The seed review calls
value clipping "completely unnecessary" for critic-free GRPO, where it has nothing to act on:
asking for it without a critic is a config error, not a silent no-op.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.conditions import one_optimizer_step
from grpo_ablate.tricks.registry import (POSITIVE, SEED_REVIEW, Claim, Inert, Trick, declare_family, option, register)

declare_family("value_clip", "the critic's loss, PPO value clipping; only with `adv=gae`",
               stage="advantage", metric="value/loss")


def _needs_a_critic(cfg):
    if option("adv", cfg.adv.name).uses_values:
        return None
    return (f"value_clip={cfg.value_clip.name} needs a critic, and adv={cfg.adv.name} has none: value clipping "
            "exists only with adv=gae (add +trick=critic_gae)")


@register("value_clip", "none",
          what="0.5 (V - R)^2 (only used with a critic, adv=gae)")
def plain_value_loss(values, old_values, returns):
    return 0.5 * (values - returns) ** 2


@register("value_clip", "clip",
          what="PPO value clipping (needs a critic: adv=gae)",
          knobs={"eps": POSITIVE},
          checks=_needs_a_critic,
          inert=Inert(one_optimizer_step, "cannot act with one optimizer step per rollout (V never moves away from "
                      "V_old)", "add updates.mini_batches=4",
                      "a critic (adv=gae) and several optimizer steps per rollout"),
          tricks=(Trick("value_clip",
                        what="PPO value clipping (needs critic_gae)",
                        source="verl critic cliprange_value",
                        verdict="completely_unnecessary",
                        cost="none beyond the critic",
                        claims=(
                            Claim("does not help", "", SEED_REVIEW,
                                  "value clipping: no gain, no stability (completely unnecessary)"),)),))
def clipped_value_loss(values, old_values, returns, *, eps: float = 0.2):
    clipped = old_values + (values - old_values).clamp(-eps, eps)
    return 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)



def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var(R - V) / Var(R) over the masked tokens (1: perfect critic, <= 0: useless)."""
    n = mask.sum().clamp(min=1)

    def var(x):
        mean = (x * mask).sum() / n
        return (((x - mean) * mask) ** 2).sum() / n
    return 1 - var(returns - values) / var(returns).clamp(min=1e-12)
