"""Family `overlong`: what happens to truncated completions (no EOS within max_new_tokens).

Every option returns (rewards, keep, penalty): `keep` [N] is False for completions whose
tokens must get no gradient, `penalty` [N] is what was added to the reward.

`filter` (DAPO overlong filtering; TRL `mask_truncated_completions`): a truncated completion
keeps its reward in the group statistics, but its tokens are masked out (no gradient, not
counted by token_mean).
`soft_punish` (DAPO soft overlong punishment; TRL `get_soft_overlong_punishment`, verl DAPO
reward manager): with L = max_new_tokens, buffer L_c and factor f,
    R_len = 0                       if |o| <= L - L_c
          = f ((L - L_c) - |o|) / L_c   if L - L_c < |o| <= L
          = -f                      beyond,
added to the task reward.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import (DAPO, NON_NEGATIVE, Activity, Claim, Allowed, Trick, declare_family, register)

declare_family("overlong", "truncated completions: masked out, or a DAPO length penalty", stage="reward",
               metric="overlong/penalty_mean")


def soft_overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0):
    """DAPO's length penalty R_len(|o|) (0 inside the budget minus the buffer, down to -factor)."""
    start = max_len - buffer
    ramp = factor * (start - lengths) / buffer
    return torch.where(lengths <= start, torch.zeros_like(ramp),
                       torch.where(lengths <= max_len, ramp, torch.full_like(ramp, -factor)))


@register("overlong", "none")
def no_overlong(rewards, lengths, truncated, max_len):
    return rewards, torch.ones_like(truncated, dtype=torch.bool), torch.zeros_like(rewards)


@register("overlong", "filter",
          activity=Activity("overlong/masked_frac"),
          tricks=(Trick("overlong_filter",
                        what="mask truncated completions out of the loss",
                        source="TRL mask_truncated_completions",
                        verdict="not_applicable",
                        claims=(
                            Claim("helps", "model=base", DAPO,
                                  "masking truncated completions (overlong filtering) steadies training"),)),))
def overlong_filter(rewards, lengths, truncated, max_len):
    return rewards, ~truncated, torch.zeros_like(rewards)


@register("overlong", "soft_punish", shapes_reward=True,
          knobs={"buffer": Allowed("integer", low=1, high="rollout.max_new_tokens"), "factor": NON_NEGATIVE},
          activity=Activity("overlong/penalty_mean"),
          tricks=(Trick("overlong_punish",
                        what="DAPO soft overlong punishment",
                        source="verl DAPO reward manager; TRL get_soft_overlong_punishment",
                        verdict="not_applicable",
                        claims=(
                            Claim("helps", "model=base", DAPO,
                                  "soft overlong punishment reduces reward noise from truncation and steadies "
                                  "training: one of DAPO's four techniques"),)),))
def overlong_soft_punish(rewards, lengths, truncated, max_len, *, buffer: int = 4096, factor: float = 1.0):
    if not 0 < buffer <= max_len:
        raise ValueError(f"overlong.buffer={buffer} is not allowed; it must be in 1..max_new_tokens ({max_len})")
    penalty = soft_overlong_penalty(lengths.to(rewards.dtype), max_len, buffer, factor)
    return rewards + penalty, torch.ones_like(truncated, dtype=torch.bool), penalty

