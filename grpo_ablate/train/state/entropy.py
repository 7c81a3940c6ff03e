"""The entropy family's state: the bonus coefficient c, which `entropy=adaptive` moves after each
step from the measured entropy (tricks/entropy.py holds the rule); checkpointed as `entropy_control`."""
from __future__ import annotations

from grpo_ablate.config.spec import RunSpec
from grpo_ablate.train.state import Plugin, stateful


class EntropyControl(Plugin):
    """The entropy bonus's coefficient this step, updated from the policy's measured entropy."""
    key = "entropy_control"

    def __init__(self, controller):
        self.controller = controller      # the option's rule (tricks/entropy.py), with its knobs

    def coefficients(self) -> dict:
        return {"entropy": self.controller.coef}

    def metrics(self, batch) -> dict:
        return {"entropy/coef": self.controller.coef}

    def after_metrics(self, metrics: dict, rows: int) -> None:
        self.controller.update(metrics["policy/entropy"])

    def state_dict(self) -> dict:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.controller.load_state_dict(state)


@stateful("entropy")
def entropy_control(spec: RunSpec, task, policies) -> EntropyControl:
    """Every run's: c is checkpointed even where it stays fixed (entropy=none: 0)."""
    return EntropyControl(spec.tricks["entropy"].fn())
