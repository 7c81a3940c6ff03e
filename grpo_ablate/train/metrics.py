"""A GRPO step's metrics, from plain tensors: one flat dict, a row of metrics.jsonl.

Token statistics are means over the trained tokens (`mask`) unless the name says otherwise.
Each family's own activity metric is here, so the report can tell a trick that acted from
one that had nothing to act on: sampling/*, overlong/*, length/reward_mean,
adv/clipped_frac, clip/*_frac, kl/*, entropy/coef, temperature/value, value/*.
"""
from __future__ import annotations

import torch

from grpo_ablate.tricks.adv import group_mean_std
from grpo_ablate.tricks.kl import k1, k3
from grpo_ablate.tricks.loss_agg import masked_mean
from grpo_ablate.tricks.value import explained_variance


def sampling_metrics(rounds: int, groups: int, rows: int, prompts_per_step: int, group_size: int) -> dict:
    """What the `sampling` family did: rounds of fresh prompts, groups kept, completions added."""
    return {"sampling/rounds": rounds,
            "sampling/kept_group_frac": groups / (rounds * prompts_per_step),
            "sampling/extra_generations": (rounds - 1) * prompts_per_step * group_size + rows - groups * group_size,
            "sampling/mean_group_size": rows / groups}


def reward_metrics(scores, rewards, group_index, overlong_penalty, keep, length_reward) -> dict:
    """`scores` the verifier's 0/1 (unshaped), `rewards` what the advantage estimator saw."""
    groups = int(group_index.max()) + 1
    _, group_std = group_mean_std(rewards, group_index)
    zero_std = torch.zeros(groups, device=rewards.device).index_fill_(0, group_index[group_std == 0], 1.0)
    return {"reward/mean": rewards.mean().item(),
            "reward/std": rewards.std().item() if rewards.numel() > 1 else 0.0,
            "train/accuracy": scores.mean().item(),
            "overlong/penalty_mean": overlong_penalty.mean().item(),
            "overlong/masked_frac": (~keep).float().mean().item(),
            "length/reward_mean": length_reward.mean().item(),
            "adv/zero_std_group_frac": zero_std.mean().item()}


def completion_metrics(lengths, truncated) -> dict:
    return {"length/mean": lengths.mean().item(), "length/max": lengths.max().item(),
            "length/truncated_frac": truncated.float().mean().item()}


def advantage_metrics(advantages, mask, clipped_frac) -> dict:
    """Over completions, or over trained tokens for a per-token estimator (gae)."""
    values = advantages[mask.bool()] if advantages.dim() == 2 else advantages
    return {"adv/mean": values.mean().item(),
            "adv/std": values.std().item() if values.numel() > 1 else 0.0,
            "adv/min": values.min().item() if values.numel() else 0.0,
            "adv/max": values.max().item() if values.numel() else 0.0,
            "adv/clipped_frac": clipped_frac.item()}


def update_metrics(entropy, mask, token_stats: dict) -> dict:
    """The policy's entropy and the loss's per-token statistics (clip fractions, critic loss)."""
    return {"policy/entropy": masked_mean(entropy, mask).item(),
            **{name: masked_mean(value, mask).item() for name, value in token_stats.items()}}


def kl_metrics(logp, ref_logp, prev_logp, mask) -> dict:
    """KL to the reference (k1 and k3, whatever estimator the loss uses) and to pi_prev."""
    out = {}
    if ref_logp is not None:
        out["kl/k1"] = masked_mean(k1(logp, ref_logp), mask).item()
        out["kl/k3"] = masked_mean(k3(logp, ref_logp), mask).item()
    if prev_logp is not None:
        out["kl/prev_k3"] = masked_mean(k3(logp, prev_logp), mask).item()
    return out


def critic_metrics(values, returns, mask) -> dict:
    return {"value/explained_variance": explained_variance(values, returns, mask).item()}


def sampler_gap_metrics(sampler_logp, logp, mask) -> dict:
    """How far the sampler's own log-probs (vLLM) are from the trainer's for the same tokens."""
    gap = (sampler_logp - logp).abs() * mask
    return {"rollout/logprob_gap_mean": (gap.sum() / mask.sum().clamp(min=1)).item(),
            "rollout/logprob_gap_max": gap.max().item()}
