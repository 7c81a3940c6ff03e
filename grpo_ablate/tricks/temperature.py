"""Family `temperature`: the sampling temperature T; training log-probs use logits / T, as in
TRL and verl, so the loss scores the distribution that was sampled.

`fixed`: T is a constant (1.0).
`learnable` (seed review "differentiable temperature"; no framework has it): T = exp(s) with s
a trainable scalar, its own learning rate, clamped to [t_min, t_max]. The same T samples the
next rollout and scales the logits in the loss, so the policy loss's gradient reaches s. The
review puts its cost at +15-20% compute; here it is one scalar in the optimizer.
"""
from __future__ import annotations

import math

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import (POSITIVE, SEED_REVIEW, Activity, Claim, Trick, declare_family, register)

declare_family("temperature", "sampling temperature; training log-probs use logits / T; `learnable` trains "
               "T = exp(s)", stage="model", default="fixed", metric="temperature/value")


def _value_within_bounds(cfg):
    t = cfg.temperature
    if t.t_min <= t.value <= t.t_max:
        return None
    return (f"temperature.value={t.value} is not allowed; it must lie in [t_min, t_max] = [{t.t_min}, {t.t_max}]")


@register("temperature", "fixed",
          what="sampling temperature; training log-probs use logits / T as in TRL and verl",
          knobs={"value": POSITIVE})
class FixedTemperature:
    def __init__(self, *, value: float = 1.0):
        self.value = float(value)

    def current(self) -> float:
        return self.value

    def param_groups(self) -> list[dict]:
        return []

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@register("temperature", "learnable",
          what="T = exp(s), s trained by the policy loss with its own lr, clamped to [t_min, t_max]",
          notes={"value": "starting T"},
          knobs={"value": POSITIVE, "lr": POSITIVE, "t_min": POSITIVE, "t_max": POSITIVE},
          checks=_value_within_bounds,
          activity=Activity("temperature/value", "changes"),
          tricks=(Trick("learnable_temperature",
                        what="differentiable sampling temperature, trained through the policy loss",
                        source="seed review (no framework has it)",
                        verdict="recommended",
                        cost="one scalar in the optimizer (the review claims +15-20% compute)",
                        claims=(
                            Claim("helps", "", SEED_REVIEW,
                                  "a differentiable temperature: medium gain (recommended), "
                                  "at 15-20% more compute"),)),))
class LearnableTemperature:
    def __init__(self, *, value: float = 1.0, lr: float = 1e-2, t_min: float = 0.5, t_max: float = 2.0):
        self.log_t = torch.nn.Parameter(torch.tensor(math.log(value)))
        self.lr, self.bounds = float(lr), (math.log(t_min), math.log(t_max))

    def current(self) -> torch.Tensor:
        """T as a tensor in the graph (the loss differentiates through it)."""
        return self.log_t.clamp(*self.bounds).exp()

    @property
    def value(self) -> float:
        return float(self.current().detach())

    def param_groups(self) -> list[dict]:
        return [{"params": [self.log_t], "lr": self.lr, "weight_decay": 0.0}]

    def state_dict(self) -> dict:
        return {"log_t": float(self.log_t.detach())}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.log_t.fill_(state["log_t"])

