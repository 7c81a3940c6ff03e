"""optim_state=reset: AdamW's state dropped after every optimizer step, or after every rollout.

The option (tricks/optim_state.py) clears the optimizer's state; this plugin calls it at the
point its `every` names (`after_optimizer_step`: slime's stateless Adam; `after_update`, once a
rollout's optimizer steps are done: slime --reset-optimizer-states) and counts the resets. The
optimizer's (now empty) state is checkpointed with the run as always; the count is the plugin's.
"""
from __future__ import annotations

from grpo_ablate.config.spec import RunSpec
from grpo_ablate.train.state import Plugin, stateful


class OptimizerReset(Plugin):
    key = "optimizer_reset"

    def __init__(self, reset, every: str):
        self.reset, self.every, self.resets = reset, every, 0

    def _reset(self, optimizer) -> None:
        self.reset(optimizer)
        self.resets += 1

    def after_optimizer_step(self, optimizer) -> None:
        if self.every == "step":
            self._reset(optimizer)

    def after_update(self, optimizer) -> None:
        if self.every == "rollout":
            self._reset(optimizer)

    def metrics(self, batch) -> dict:
        return {"optim/state_resets": self.resets}

    def state_dict(self) -> dict:
        return {"resets": self.resets}

    def load_state_dict(self, state: dict) -> None:
        self.resets = int(state["resets"])


@stateful("optim_state")
def optimizer_reset(spec: RunSpec, task, policies) -> OptimizerReset | None:
    """The plugin when the optim_state option resets the optimizer, else None."""
    state = spec.tricks["optim_state"]
    if not state.option.resets_optimizer:
        return None
    return OptimizerReset(state.fn, str(state.values["every"]))
