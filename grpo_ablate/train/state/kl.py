"""The kl family's state: its controller's beta, and kl=two_layer's second anchor.

Every kl option is a controller (tricks/kl.py): beta weighs the loss's KL term or the reward's
penalty, and an adaptive option updates it after each step from the measured KL (`kl/k3`).
`KLControl` hands the trainer those weights and keeps beta in the checkpoint (`kl_control`).

kl=two_layer's second anchor is the policy as it was `prev_lag` steps ago.

The option (tricks/kl.py `TwoLayerKL`) weighs KL(pi || pi_prev); its plugin reads pi_prev's
weights from the run's one `PolicyHistory` (train/policy_history.py, checkpointed with the run)
into a frozen copy of the policy (grpo.py loads it when beta_prev > 0) and hands the trainer its
log-probs as the `prev` anchor. The plugin itself keeps nothing: no checkpoint entry of its own.
"""
from __future__ import annotations

import torch

from grpo_ablate.config.spec import RunSpec
from grpo_ablate.train.state import Plugin, stateful


class KLControl(Plugin):
    """The kl option's beta: the loss's or the reward's KL weight (and two_layer's beta_prev),
    updated after each step from the KL to the reference measured in it."""
    key = "kl_control"

    def __init__(self, controller):
        self.controller = controller      # the option's rule (tricks/kl.py), with its knobs

    def coefficients(self) -> dict:
        c = self.controller
        return {"kl": c.loss_beta, "kl_prev": c.beta_prev, "kl_reward": c.reward_beta}

    def metrics(self, batch) -> dict:
        return {"kl/beta": self.controller.beta}

    def after_metrics(self, metrics: dict, rows: int) -> None:
        if "kl/k3" in metrics:     # measured only when a reference is run
            self.controller.update(metrics["kl/k3"], num_sequences=rows)

    def state_dict(self) -> dict:
        return self.controller.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.controller.load_state_dict(state)


@stateful("kl")
def kl_control(spec: RunSpec, task, policies) -> KLControl:
    """Every run's: beta is checkpointed even where it stays fixed (kl=none: 0)."""
    return KLControl(spec.tricks["kl"].fn())


class PreviousPolicy(Plugin):
    """kl=two_layer's second anchor: log-probs of the policy as it was `lag` steps before this
    one's weights (the oldest kept while the run is younger), in a frozen copy of the policy."""

    def __init__(self, frozen_copy: torch.nn.Module, lag: int):
        self.model, self.lag = frozen_copy, lag
        self.history_depth = lag + 1

    def anchors(self, part, temperature: float, forward, history) -> dict:
        self.model.load_state_dict(history.at_age(self.lag))
        return {"prev": forward(self.model, part, temperature)}


@stateful("kl")
def previous_policy(spec: RunSpec, task, policies) -> PreviousPolicy | None:
    """The anchor when the kl option anchors to a previous policy (a frozen copy was loaded), else None."""
    if policies.previous is None:
        return None
    return PreviousPolicy(policies.previous, policies.previous_lag)
