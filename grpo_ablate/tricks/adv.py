"""Family `adv`: advantage estimators, r (one scalar per completion) -> A (one per completion).

Groups are given as `group_index` (completion j belongs to prompt group_index[j]), which also
covers ragged groups. Every estimator returns A of the same shape as r; the trainer
broadcasts A over the completion's tokens. std is Bessel-corrected (N-1), as in TRL, verl
and ROLL.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class AdvantageEstimator:
    fn: Callable[..., torch.Tensor]
    uses_group_statistic: bool  # needs G >= 2 completions per prompt to mean anything


ADV_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_adv(name: str, uses_group_statistic: bool = True):
    def wrap(fn):
        ADV_ESTIMATORS[name] = AdvantageEstimator(fn, uses_group_statistic)
        return fn
    return wrap


def group_mean_std(values: torch.Tensor, group_index: torch.Tensor):
    """Per-completion mean and Bessel-corrected std of its group (0 std for a group of one)."""
    n_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    count = torch.zeros(n_groups, dtype=values.dtype, device=values.device)
    count.index_add_(0, group_index, torch.ones_like(values))
    total = torch.zeros_like(count).index_add_(0, group_index, values)
    mean = (total / count)[group_index]
    sq = torch.zeros_like(count).index_add_(0, group_index, (values - mean) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))[group_index]
    return mean, std


@register_adv("grpo")
def grpo_advantage(rewards, group_index, eps: float = 1e-6, **_):
    """A_j = (r_j - mean_g r) / (std_g r + eps).

    Reference: TRL grpo_trainer `_generate_and_score_completions` with scale_rewards="group";
    verl core_algos `compute_grpo_outcome_advantage` (adv_estimator=grpo). eps defaults to
    verl/ROLL's 1e-6 (TRL uses 1e-4). A group whose rewards are all equal gets A = 0.
    """
    mean, std = group_mean_std(rewards, group_index)
    return (rewards - mean) / (std + eps)


@register_adv("dr_grpo")
def dr_grpo_advantage(rewards, group_index, **_):
    """A_j = r_j - mean_g r (no division by the group std).

    Reference: Dr. GRPO (arXiv 2503.20783); TRL scale_rewards="none"; verl
    norm_adv_by_std_in_grpo=False.
    """
    mean, _ = group_mean_std(rewards, group_index)
    return rewards - mean
