"""Family `length`: length terms added to the reward (the seed review's top pick).

Every option returns (rewards, length_reward) with length_reward [N] what was added.
`penalty`: r <- r - lam * |o| / L, L = max_new_tokens (lam = 0.1).
`group` (Kimi k1.5 length reward, group-relative form): in each group
    lam_j = 0.5 - (|o_j| - min_len) / (max_len - min_len)      (0 when all lengths are equal)
correct completions get + w * lam_j, wrong ones + w * min(0, lam_j) (w = 1.0): short correct
answers are rewarded, long wrong ones punished, short wrong ones never rewarded.
Reference: Kimi k1.5 (arXiv 2501.12599), section 2.3.3.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import (NUMBER, SEED_REVIEW, Activity, Claim, Trick, declare_family, register)

declare_family("length", "length terms in the reward; `group` is Kimi k1.5's",
               stage="reward", metric="length/reward_mean")


@register("length", "none")
def no_length(rewards, lengths, group_index, correct, max_len):
    return rewards, torch.zeros_like(rewards)


@register("length", "penalty", shapes_reward=True,
          knobs={"lam": NUMBER},
          activity=Activity("length/reward_mean"),
          tricks=(Trick("length_penalty",
                        what="reward minus 0.1 * length / budget",
                        source="seed review: length normalization",
                        verdict="strongly_recommended",
                        claims=(
                            Claim("helps", "", SEED_REVIEW,
                                  "length normalization: high gain, high stability (strongly recommended; essentially"
                                  " required for math and code)"),)),))
def length_penalty(rewards, lengths, group_index, correct, max_len, *, lam: float = 0.1):
    bonus = -lam * lengths.to(rewards.dtype) / max_len
    return rewards + bonus, bonus


@register("length", "group", shapes_reward=True,
          knobs={"weight": NUMBER},
          activity=Activity("length/reward_mean"),
          tricks=(Trick("length_group",
                        what="Kimi k1.5 group length reward",
                        source="Kimi k1.5",
                        verdict="strongly_recommended",
                        claims=(
                            Claim("helps", "", SEED_REVIEW,
                                  "length normalization: high gain, high stability (strongly recommended; essentially"
                                  " required for math and code)"),)),))
def group_length_reward(rewards, lengths, group_index, correct, max_len, *, weight: float = 1.0):
    lengths = lengths.to(rewards.dtype)
    n_groups = int(group_index.max()) + 1
    full = lambda value: torch.full((n_groups,), value, dtype=rewards.dtype, device=rewards.device)
    lo = full(float("inf")).scatter_reduce(0, group_index, lengths, "amin")
    hi = full(float("-inf")).scatter_reduce(0, group_index, lengths, "amax")
    lo, hi = lo[group_index], hi[group_index]
    spread = hi - lo
    lam = torch.where(spread > 0, 0.5 - (lengths - lo) / spread.clamp(min=1e-12), torch.zeros_like(lengths))
    bonus = weight * torch.where(correct, lam, lam.clamp(max=0.0))
    return rewards + bonus, bonus

