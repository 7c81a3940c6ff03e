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

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.conditions import total_optimizer_steps
from grpo_ablate.tricks.registry import FRACTION, POSITIVE_INT, Activity, Inert, Trick, declare_family, register

declare_family("ref_sync", "every `ref_sync.every` optimizer steps π_ref ← α π + (1-α) π_ref (TR-DPO; needs "
               "kl.beta > 0)", stage="async", metric="ref_sync/syncs",
               settings={"every": (POSITIVE_INT, "syncs_reference")},   # optimizer steps between two syncs
               defaults={"every": 512})   # TRL ref_model_sync_steps


def reference_never_syncs(cfg) -> bool:
    return int(cfg.ref_sync.every) > total_optimizer_steps(cfg) or float(cfg.ref_sync.alpha) == 0


def _needs_a_reference_of_its_own(cfg):
    if cfg.kl.beta <= 0:
        return (f"ref_sync={cfg.ref_sync.name} moves the reference policy, but kl={cfg.kl.name} has none (beta 0): "
                "use kl=fixed (or another KL with beta > 0)")
    lora = cfg.model.get("lora")
    if lora is not None and lora.r != 0:
        return (f"ref_sync={cfg.ref_sync.name} needs a reference of its own; with LoRA the reference is the base "
                "model under the adapters: model.lora.r=0, or ref_sync=none")
    return None


@register("ref_sync", "none",
          what="the reference policy stays the starting model")
def keep_reference(reference, policy) -> None:
    """The reference stays the starting model."""


@register("ref_sync", "mixup",
          what="TR-DPO reference sync (TRL sync_ref_model): every `every` optimizer steps, pi_ref <- alpha pi_theta +"
               " (1 - alpha) pi_ref, parameter by parameter (needs a KL term: beta > 0)",
          notes={"alpha": "TRL ref_model_mixup_alpha",
                 "every": "TRL ref_model_sync_steps (a run of this project's length never reaches it: lower it)"},
          syncs_reference=True,
          knobs={"alpha": FRACTION},
          activity=Activity("ref_sync/syncs"),
          checks=_needs_a_reference_of_its_own,
          inert=Inert(reference_never_syncs, "never moves the reference: ref_sync.every is beyond the run's optimizer "
                      "steps (or alpha is 0)",
                      "set ref_sync.every <= steps x updates.mini_batches x updates.epochs (and alpha > 0)",
                      "a KL term (kl.beta > 0) and ref_sync.every <= the run's optimizer steps"),
          tricks=(Trick("ref_sync",
                        what="reference moved toward the policy, pi_ref <- 0.6 pi + 0.4 pi_ref every 10 optimizer "
                             "steps",
                        source="TRL sync_ref_model (TR-DPO, arXiv 2404.09656)",
                        verdict="not_in_review",
                        cost="a parameter copy every sync (needs a KL term)",
                        settings={"every": 10}),   # TRL's 512 is beyond a run of this project's length
                  # slime --ref-update-interval N: the actor's weights copied into the reference every N
                  # rollout steps (one optimizer step each with updates.mini_batches=1): mixup with alpha 1
                  Trick("ref_update_interval",
                        what="reference replaced by the policy every 10 optimizer steps (alpha 1)",
                        source="slime --ref-update-interval (rollout steps between copies of the actor into ref)",
                        verdict="not_in_review",
                        cost="a parameter copy every sync (needs a KL term)",
                        settings={"alpha": 1.0, "every": 10})))   # a copy, not a mix: slime backs the actor up
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
