"""Family `off_policy_mask`: drop whole sequences that are both off-policy and negatively rewarded.

Every option takes (logp, sampler_logp, advantages, mask) -- the current policy's and the
sampler's per-token log-probs [N, T], advantages [N, 1] or [N, T], the trained-token mask --
and returns the mask of tokens to keep [N, T] (a subset of `mask`, whole sequences, no
gradient); the trainer multiplies the policy loss by it.

`sequence` (DeepSeek-V3.2, arXiv 2512.02556, eq. 9; TRL `off_policy_mask_threshold`):
    D_i = mean_t (log pi_sampler - log pi_theta)   over the sequence's trained tokens
    keep sequence i  iff  A_i >= 0  or  D_i <= delta
Reference: TRL `get_off_policy_mask` (sampling_per_token_logps, or pi_old when there are no
sampler log-probs: the trainer passes old_logp then; NaN log-ratios count as 0). A_i is the
sequence's advantage ([N, 1]) or the mean of its token advantages ([N, T]). With the sampler
equal to the current policy D = 0 and nothing is dropped: the mask acts only with several
optimizer steps per rollout or a sampler-trainer mismatch.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.behaviour import log_ratio as behaviour_log_ratio
from grpo_ablate.tricks.conditions import policy_never_leaves_sampler
from grpo_ablate.tricks.registry import NON_NEGATIVE, Activity, Inert, Trick, declare_family, register

declare_family("off_policy_mask", "drop A < 0 sequences whose sampler log-ratio exceeds δ (DeepSeek-V3.2)",
               stage="loss",
               metric="off_policy_mask/dropped_frac")


@register("off_policy_mask", "none",
          what="no sequence is dropped for being off-policy")
def keep_all_sequences(logp, sampler_logp, advantages, mask):
    return mask


@register("off_policy_mask", "sequence",
          what="DeepSeek-V3.2 off-policy sequence masking (TRL off_policy_mask_threshold): a sequence with A < 0 "
               "whose mean log(pi_sampler / pi_theta) exceeds delta gets no policy gradient",
          notes={"delta": "TRL's example value"},
          off_policy_only=True, needs_sampler_logprobs=True, needs_old_forward=True,
          knobs={"delta": NON_NEGATIVE},
          activity=Activity("off_policy_mask/dropped_frac"),
          inert=Inert(policy_never_leaves_sampler, "cannot act: with one optimizer step and the sampler the trainer "
                      "itself, log pi_sampler - log pi ≡ 0",
                      "add updates.mini_batches=4, or sample with rollout.dtype=bfloat16 (rollout=vllm on a GPU)",
                      "several optimizer steps per rollout or a sampler that differs from the trainer"),
          tricks=(Trick("off_policy_mask",
                        what="drop sequences with A < 0 whose sampler log-ratio exceeds delta",
                        source="TRL off_policy_mask_threshold; slime --use-opsm/--opsm-delta (DeepSeek-V3.2, arXiv "
                               "2512.02556)",
                        verdict="not_in_review",
                        cost="a pi_old forward per step (the sampler's log-probs are recorded while sampling)"),))
def off_policy_sequence_mask(logp, sampler_logp, advantages, mask, *, delta: float = 0.5):
    """Keep [N, T]: 0 on every token of a sequence with A < 0 and mean log-ratio above delta."""
    with torch.no_grad():
        mask_f = mask.to(logp.dtype)
        lengths = mask_f.sum(dim=-1, keepdim=True)
        divergence = -behaviour_log_ratio(logp.detach(), sampler_logp)   # log mu - log pi; unknown mu: 0
        mean_divergence = (divergence * mask_f).sum(dim=-1, keepdim=True) / lengths.clamp(min=1)
        advantage = (advantages if advantages.shape[-1] == 1    # per sequence, or its tokens' mean
                     else (advantages * mask_f).sum(dim=-1, keepdim=True) / lengths.clamp(min=1))
        keep = (advantage >= 0) | (mean_divergence <= delta)
        return mask * keep.to(mask.dtype)
