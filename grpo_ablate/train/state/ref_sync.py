"""ref_sync: the frozen reference moves toward the policy every `ref_sync.every` optimizer steps.

The family's option (tricks/ref_sync.py) mixes the parameters; this object counts the
optimizer steps (TRL syncs when global_step % ref_model_sync_steps == 0, global_step counting
optimizer steps) and is checkpointed with the reference's weights: after a sync the reference
is no longer the starting model, which is where a resumed run would otherwise reload it from.
"""
from __future__ import annotations

import torch

from grpo_ablate.config.spec import RunSpec
from grpo_ablate.train.state import Plugin, stateful


class ReferenceSync(Plugin):
    key = "reference_sync"

    def __init__(self, mix, every: int, reference: torch.nn.Module, policy: torch.nn.Module):
        self.mix, self.every = mix, every      # the option's mixing rule; optimizer steps between two syncs
        self.reference, self.policy = reference, policy
        self.optimizer_steps, self.syncs = 0, 0

    def after_optimizer_step(self, optimizer) -> None:
        self.optimizer_steps += 1
        if self.optimizer_steps % self.every == 0:
            self.mix(self.reference.parameters(), self.policy.parameters())
            self.syncs += 1

    def metrics(self, batch) -> dict:
        return {"ref_sync/syncs": self.syncs}

    def state_dict(self) -> dict:
        return {"optimizer_steps": self.optimizer_steps, "syncs": self.syncs,
                "reference": {k: v.detach().clone() for k, v in self.reference.state_dict().items()}}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer_steps, self.syncs = int(state["optimizer_steps"]), int(state["syncs"])
        self.reference.load_state_dict(state["reference"])


@stateful("ref_sync")
def reference_sync(spec: RunSpec, task, policies) -> ReferenceSync | None:
    """The run's ReferenceSync when its ref_sync option moves the reference, else None."""
    sync = spec.tricks["ref_sync"]
    if not sync.option.syncs_reference:
        return None
    return ReferenceSync(sync.fn, int(sync.values["every"]), policies.reference, policies.policy)
