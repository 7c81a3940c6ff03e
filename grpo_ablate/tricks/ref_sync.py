"""Family `ref_sync`: move the frozen reference policy toward the trained one, now and then.

Every option takes (reference, policy): two equally long sequences of tensors (the two
models' parameters, in the same order) and updates `reference` in place; the trainer calls it
every `ref_sync.every` optimizer steps (a trainer key: the functions never see it).

`mixup` (TR-DPO, arXiv 2404.09656; TRL `sync_ref_model`):
    pi_ref <- alpha pi_theta + (1 - alpha) pi_ref     parameter by parameter
Reference: TRL `SyncRefModelCallback._sync_target_model` (ref_model_mixup_alpha 0.6, applied
when global_step % ref_model_sync_steps == 0, ref_model_sync_steps 512). TRL refuses it with
beta = 0 (no reference) and with PEFT models (the reference is the adapter-free base); so does
this project's config check. alpha = 1 copies the policy (a hard reset).
"""
from __future__ import annotations

import torch

from grpo_ablate.tricks.registry import register


@register("ref_sync", "none")
def keep_reference(reference, policy) -> None:
    """The reference stays the starting model."""


@register("ref_sync", "mixup", syncs_reference=True)
def mixup_reference(reference, policy, *, alpha: float = 0.6) -> None:
    """reference <- alpha policy + (1 - alpha) reference, in place."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"ref_sync.alpha={alpha!r} is not allowed; it must lie in [0, 1]")
    reference, policy = list(reference), list(policy)
    if len(reference) != len(policy):
        raise ValueError(f"ref_sync: the reference has {len(reference)} tensors, the policy {len(policy)}")
    with torch.no_grad():
        for ref, new in zip(reference, policy):
            ref.mul_(1.0 - alpha).add_(new.detach().to(ref.dtype), alpha=alpha)
