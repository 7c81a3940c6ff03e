"""adv=rae: the EMA baseline carried across steps.

The option (tricks/adv/reinforce.py `rae_advantage`) scores each row against an EMA of the rewards
before it; this plugin keeps the EMA between steps: it hands the estimator the baseline the step
starts from (`estimator_input`) and moves it over the step's rewards, row by row, once the
advantages are taken (`after_advantages`). It is checkpointed with the run.
"""
from __future__ import annotations

import torch

from grpo_ablate.spec import RunSpec
from grpo_ablate.train.plugin import Plugin
from grpo_ablate.tricks.adv.reinforce import ema_baselines


class EmaBaseline(Plugin):
    key = "ema_baseline"

    def __init__(self, decay: float):
        self.decay, self.baseline = decay, 0.0      # prime-rl's baselines start at 0

    def estimator_input(self):
        return torch.tensor([self.baseline], dtype=torch.float64)

    def after_advantages(self, rewards) -> None:
        self.baseline = ema_baselines(rewards.double(), self.baseline, self.decay)[1]

    def metrics(self, batch) -> dict:
        return {"adv/ema_baseline": self.baseline}

    def state_dict(self) -> dict:
        return {"baseline": self.baseline}

    def load_state_dict(self, state: dict) -> None:
        self.baseline = float(state["baseline"])


def ema_baseline(spec: RunSpec, task, policies) -> EmaBaseline | None:
    """The plugin when the adv option carries a baseline across steps, else None."""
    adv = spec.tricks["adv"]
    if not adv.option.carries_baseline:
        return None
    return EmaBaseline(float(adv.values["decay"]))
