"""kl=two_layer's state: the policy as it was `prev_lag` steps ago, the loss's second anchor.

The option (tricks/kl.py `TwoLayerKL`) weighs KL(pi || pi_prev); its plugin reads pi_prev's
weights from the run's one `PolicyHistory` (train/policy_history.py, checkpointed with the run)
into a frozen copy of the policy (grpo.py loads it when beta_prev > 0) and hands the trainer its
log-probs as the `prev` anchor. The plugin itself keeps nothing: no checkpoint entry of its own.
"""
from __future__ import annotations

import torch

from grpo_ablate.config.spec import RunSpec
from grpo_ablate.train.state import Plugin, stateful


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
