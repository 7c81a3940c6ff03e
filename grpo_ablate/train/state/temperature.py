"""The temperature family's state: the T a step samples at and its loss scores at (logits / T).
`temperature=learnable` trains T = exp(s) through the policy loss: s is an optimizer group of its
own (tricks/temperature.py holds the rule); checkpointed as `temperature`."""
from __future__ import annotations

from grpo_ablate.config.spec import RunSpec
from grpo_ablate.train.state import Plugin, stateful


class TemperatureControl(Plugin):
    """This step's T: a number, or a tensor in the loss's graph when it is trained."""
    key = "temperature"

    def __init__(self, controller):
        self.controller = controller      # the option's rule (tricks/temperature.py), with its knobs

    def temperature(self, T):
        return self.controller.current()

    def param_groups(self) -> list[dict]:
        return self.controller.param_groups()

    def state_dict(self) -> dict:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.controller.load_state_dict(state)


@stateful("temperature")
def temperature_control(spec: RunSpec, task, policies) -> TemperatureControl:
    """Every run's: the sampling temperature is the family's, fixed or trained."""
    return TemperatureControl(spec.tricks["temperature"].fn())
