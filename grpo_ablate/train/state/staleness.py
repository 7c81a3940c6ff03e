"""Stale rollouts (family `staleness`): each group sampled by the policy of its age.

The run's `PolicyHistory` (train/policy_history.py) keeps the policy's weights at the start of the last
k + 1 steps or more (newest last: the current weights); `Staleness`, the family's plugin, asks
for that depth and puts `StaleRollouts` in place of the step's sampler. `StaleRollouts` stands in for the
trainer's `Rollouts` for one step: the family's option gives each group of a call its age
(seeded by seed, step and the call's key), the trainer's own policy is loaded with the weights
of that age while it samples those groups, and the current weights are loaded back afterwards
(an exact copy: nothing of the update is lost). The rows come back in the call's order,
carrying their ages and whether they are kept (`Rollout.ages`, `Rollout.kept`); the sampler's
log-probs they carry are then the behaviour policy's (AReaL's pi_behave).

With staleness=none the trainer keeps no history and calls its `Rollouts` itself: the path,
and so every metric, is exactly the synchronous one.
"""
from __future__ import annotations

import torch

from grpo_ablate.sampling.decode import concat_rollouts, derived_seed, select_rows
from grpo_ablate.sampling.engines import Scored
from grpo_ablate.config.spec import RunSpec
from grpo_ablate.train.policy_history import PolicyHistory
from grpo_ablate.train.state import Plugin, stateful
from grpo_ablate.tricks.staleness import oldest_age


class StaleRollouts:
    """`Rollouts` for one step whose groups are sampled by the policy of their age."""

    def __init__(self, rollouts, model, history: PolicyHistory, choose_ages, seed: int):
        self.rollouts, self.model, self.history, self.seed = rollouts, model, history, seed
        self.choose_ages = choose_ages     # the staleness option: (groups, oldest, generator) -> (ages, keep[, queued])
        self.pad_id = rollouts.pad_id

    def __call__(self, problems: list, n: int, temperature: float, key: tuple, max_new_tokens=None) -> Scored:
        draws = torch.Generator().manual_seed(derived_seed(self.seed, ("staleness", *key)))
        ages, kept, *split = self.choose_ages(len(problems), self.history.oldest_age, draws)
        pieces, order = [], []
        for age in sorted(set(ages.tolist())):
            groups = (ages == age).nonzero().squeeze(1).tolist()
            with self.history.sampling_as(self.model, age):
                piece = self.rollouts([problems[g] for g in groups], n, temperature, (*key, "age", age),
                                      max_new_tokens)
            pieces.append(piece)
            order += [g * n + j for g in groups for j in range(n)]
        roll = concat_rollouts([p.roll for p in pieces], self.pad_id)
        texts = [t for p in pieces for t in p.texts]
        scores = torch.cat([p.scores for p in pieces])
        back = torch.argsort(torch.tensor(order))              # the call's row order
        roll = select_rows(roll, back.to(roll.sequences.device))
        roll.ages = ages.repeat_interleave(n).to(roll.sequences.device)
        roll.kept = kept.repeat_interleave(n).to(roll.sequences.device)
        if split:                                              # the in-queue part of each age (exact)
            roll.queued = split[0].repeat_interleave(n).to(roll.sequences.device)
        return Scored(roll, [texts[i] for i in back.tolist()], scores[back])


class Staleness(Plugin):
    """The staleness family's plugin: each step's groups sampled by the policies of their ages."""

    def __init__(self, k: int, choose_ages, seed: int):
        self.history_depth = k + 1                 # the weights of the last k steps and now
        self.choose_ages, self.seed = choose_ages, seed

    def sampler(self, rollouts, model, history: PolicyHistory):
        return StaleRollouts(rollouts, model, history, self.choose_ages, self.seed)


@stateful("staleness")
def staleness(spec: RunSpec, task, policies) -> Staleness | None:
    """The plugin when the staleness option samples with older policies, else None."""
    stale = spec.tricks["staleness"]
    if not stale.option.stale:
        return None
    return Staleness(oldest_age(stale.values), stale.fn, spec.seed)
