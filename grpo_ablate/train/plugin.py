"""The plugin protocol: how a trick with state of its own joins a run without the trainer naming it.

Most tricks are pure functions bound once (`LossTerms`, `RewardShaping`, `AdvantageChain`). A few
bring state that lives across steps and is checkpointed with the run: a prompt pool, a replay
buffer, the policy's older weights, a reference that moves. Each is a `Plugin`; `GRPOTrainer`
calls every active plugin at fixed points of a step, in the order train/plugins.py lists them,
and a plugin overrides only the hooks it needs:

    prompts(source)                 the prompt source the step's sampling rounds draw from
    sampler(rollouts, model, history)   this step's sampler (a wrapper around the trainer's)
    after_sampling(batch, step, pad_id) the batch that is trained on
    anchors(part, T, forward, history)  frozen-policy log-probs by `Anchors` field (no gradient)
    estimator_input()               what the advantage estimator reads (`values`), or None
    after_advantages(rewards)       the rewards the estimator saw, once the advantages are taken
    after_optimizer_step(optimizer) once after every optimizer step
    after_update(optimizer)         once a rollout's optimizer steps are done
    metrics(batch)                  this step's metrics of its own
    state_dict(), load_state_dict() checkpointed with the run under `key`

"The policy's weights k steps ago" is one mechanism for every plugin: the trainer keeps one
`PolicyHistory` (train/history.py) as deep as the deepest `history_depth` asked for, pushes the
weights each step starts from, and hands it to the hooks that read it.

This module imports nothing of grpo_ablate: the plugins import it, train/plugins.py lists them.
"""
from __future__ import annotations


class Plugin:
    """A stateful trick's hooks; each default leaves the step as it is."""

    key: str = ""            # its checkpoint entry (stable: a resumed run finds its state by it)
    history_depth: int = 0   # how many past steps of the policy's weights it reads (0: none)
    samples_older_policies: bool = False   # its sampler is not the current policy: pi_old needs a forward

    def prompts(self, source):
        return source

    def sampler(self, rollouts, model, history):
        return rollouts

    def after_sampling(self, batch, step: int, pad_id: int):
        return batch

    def anchors(self, part, temperature: float, forward, history) -> dict:
        return {}

    def estimator_input(self):
        return None

    def after_advantages(self, rewards) -> None:
        return None

    def after_optimizer_step(self, optimizer) -> None:
        return None

    def after_update(self, optimizer) -> None:
        return None

    def metrics(self, batch) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None
