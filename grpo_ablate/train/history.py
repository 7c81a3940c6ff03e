"""The policy's weights k steps ago: one `PolicyHistory` per run, and the two-layer KL's anchor.

The trainer keeps the weights each of the last `depth` steps started from (newest last: the
current weights) when a plugin asks for them (`Plugin.history_depth`): staleness samples groups
with the policy of their age (train/staleness.py); kl=two_layer anchors the loss to the policy of
`prev_lag` steps ago (`PreviousPolicy` below). One history serves both, checkpointed with the run.
"""
from __future__ import annotations

from collections import deque
from contextlib import contextmanager

import torch

from grpo_ablate.spec import RunSpec
from grpo_ablate.train.plugin import Plugin


class PolicyHistory:
    """The policy's weights at the start of each of the last `depth` steps (the last: now)."""

    def __init__(self, depth: int):
        self.weights = deque(maxlen=depth)

    def push(self, model) -> None:
        self.weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    @property
    def oldest_age(self) -> int:
        return len(self.weights) - 1

    def at_age(self, age: int) -> dict:
        """The weights of `age` steps ago (the oldest kept, early in a run)."""
        return self.weights[-1 - min(age, self.oldest_age)]

    @contextmanager
    def sampling_as(self, model, age: int):
        """`model` holds the weights of `age` steps ago inside; the current ones after."""
        if age == 0:
            yield
            return
        model.load_state_dict(self.at_age(age))
        try:
            yield
        finally:
            model.load_state_dict(self.weights[-1])

    def state_dict(self) -> dict:
        return {"weights": list(self.weights)}

    def load_state_dict(self, state: dict) -> None:
        self.weights.clear()
        self.weights.extend(state["weights"])


class PreviousPolicy(Plugin):
    """kl=two_layer's second anchor: log-probs of the policy as it was `lag` steps before this
    one's weights (the oldest kept while the run is younger), in a frozen copy of the policy."""

    def __init__(self, frozen_copy: torch.nn.Module, lag: int):
        self.model, self.lag = frozen_copy, lag
        self.history_depth = lag + 1

    def anchors(self, part, temperature: float, forward, history) -> dict:
        self.model.load_state_dict(history.at_age(self.lag))
        return {"prev": forward(self.model, part, temperature)}


def previous_policy(spec: RunSpec, task, policies) -> PreviousPolicy | None:
    """The anchor when the kl option anchors to a previous policy (a frozen copy was loaded), else None."""
    if policies.previous is None:
        return None
    return PreviousPolicy(policies.previous, policies.previous_lag)


def upgraded_checkpoint(state: dict) -> dict:
    """A trainer checkpoint written before the one history: kl=two_layer kept its own `snapshots`
    (the weights after each update, the last one the current weights, which the next step pushes
    again), now `policy_history`'s weights each step started from."""
    if "snapshots" not in state:
        return state
    old = {key: value for key, value in state.items() if key != "snapshots"}
    if state["snapshots"] and "policy_history" not in state:
        old["policy_history"] = {"weights": list(state["snapshots"])[:-1]}
    return old
