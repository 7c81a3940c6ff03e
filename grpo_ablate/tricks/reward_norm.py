"""Family `reward_norm`: global reward normalization before the advantage (seed blog: harmful).

`batch`: r <- (r - mean_B r) / (std_B r + eps), std Bessel-corrected. Algebra the report must
not hide: followed by adv=grpo it equals grpo up to the effective eps; followed by
adv=dr_grpo it equals adv=lite. It matters only with a non-affine step in between (an added
length or overlong term, reward clipping) or several reward sources. No framework has it as
a toggle; it is in the seed review's table.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import (POSITIVE, SEED_REVIEW, Claim, Inert, Trick, declare_family, option, register)

declare_family("reward_norm", "global reward normalization before the advantage", stage="reward", metric="reward/mean")


@register("reward_norm", "none")
def no_reward_norm(rewards: torch.Tensor) -> torch.Tensor:
    return rewards


@register("reward_norm", "batch",
          what="r <- (r - mean_batch r) / (std_batch r + eps) before the advantage (seed review: not recommended)",
          knobs={"eps": POSITIVE},
          inert=Inert(lambda cfg: option("adv", cfg.adv.name).undoes_affine_maps,
                      "is undone by the advantage estimator, which normalizes again (an affine map of the rewards "
                      "gives the same advantages)", "use adv=dr_grpo or adv=rloo (no division by a std)",
                      "an estimator that does not divide by a std (adv=dr_grpo, rloo, gae)"),
          tricks=(Trick("global_reward_norm",
                        what="normalize rewards over the batch before the advantage",
                        source="seed review (no framework toggle)",
                        verdict="not_recommended",
                        claims=(
                            Claim("does not help", "", SEED_REVIEW,
                                  "global reward normalization: no gain, low stability (not recommended)"),)),))
def batch_reward_norm(rewards: torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    std = rewards.std() if rewards.numel() > 1 else torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    return (rewards - rewards.mean()) / (std + eps)

