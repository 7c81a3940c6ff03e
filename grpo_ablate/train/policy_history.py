"""The policy's weights k steps ago: one `PolicyHistory` per run, shared by every plugin that reads them.

The trainer keeps the weights each of the last `depth` steps started from (newest last: the
current weights) when a plugin asks for them (`Plugin.history_depth`): staleness samples groups
with the policy of their age (train/state/staleness.py); kl=two_layer anchors the loss to the
policy of `prev_lag` steps ago (train/state/kl.py). One history serves both, checkpointed with the run.
"""
from __future__ import annotations

from collections import deque
from contextlib import contextmanager


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


def policy_history(plugins: list) -> PolicyHistory | None:
    """The one history of the policy's weights, as deep as the deepest plugin reads (else None)."""
    depth = max((plugin.history_depth for plugin in plugins), default=0)
    return PolicyHistory(depth) if depth else None


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
