"""Stale rollouts (family `staleness`): each group sampled by the policy of its age.

`PolicyHistory` keeps the policy's weights at the start of the last k + 1 steps (newest last:
the current weights) and is checkpointed with the run. `StaleRollouts` stands in for the
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

from collections import deque
from contextlib import contextmanager

import torch

from grpo_ablate.sampling.decode import concat_rollouts, derived_seed, select_rows
from grpo_ablate.sampling.engines import Scored
from grpo_ablate.tricks.behaviour import log_ratio as behaviour_log_ratio
from grpo_ablate.tricks.loss_agg import masked_mean


class PolicyHistory:
    """The policy's weights at the start of each of the last `depth` steps (the last: now)."""

    def __init__(self, depth: int):
        self.weights = deque(maxlen=depth)

    def push(self, model) -> None:
        self.weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    @property
    def oldest_age(self) -> int:
        return len(self.weights) - 1

    @contextmanager
    def sampling_as(self, model, age: int):
        """`model` holds the weights of `age` steps ago inside; the current ones after."""
        if age == 0:
            yield
            return
        model.load_state_dict(self.weights[-1 - age])
        try:
            yield
        finally:
            model.load_state_dict(self.weights[-1])

    def state_dict(self) -> dict:
        return {"weights": list(self.weights)}

    def load_state_dict(self, state: dict) -> None:
        self.weights.clear()
        self.weights.extend(state["weights"])


class StaleRollouts:
    """`Rollouts` for one step whose groups are sampled by the policy of their age."""

    def __init__(self, rollouts, model, history: PolicyHistory, choose_ages, seed: int):
        self.rollouts, self.model, self.history, self.seed = rollouts, model, history, seed
        self.choose_ages = choose_ages     # the staleness option: (groups, oldest, generator) -> (ages, keep)
        self.pad_id = rollouts.pad_id

    def __call__(self, problems: list, n: int, temperature: float, key: tuple, max_new_tokens=None) -> Scored:
        draws = torch.Generator().manual_seed(derived_seed(self.seed, ("staleness", *key)))
        ages, kept = self.choose_ages(len(problems), self.history.oldest_age, draws)
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
        return Scored(roll, [texts[i] for i in back.tolist()], scores[back])


@torch.no_grad()
def staleness_metrics(ages, kept, old_logp, sampler_logp, mask) -> dict:
    """How stale the step's rows were and how far their sampler was from pi_old (the proximal
    policy before this update): KL(mu || pi_old) per token on mu's samples, k1 and k3."""
    kept = torch.ones_like(ages, dtype=torch.bool) if kept is None else kept     # (replayed rows: all kept)
    kept_f = kept.to(mask.dtype)
    trained = ages[kept]
    out = {"staleness/mean_age": trained.float().mean().item() if trained.numel() else 0.0,
           "staleness/max_age": int(trained.max()) if trained.numel() else 0,
           "staleness/stale_frac": (ages > 0).float().mean().item(),
           "staleness/dropped_frac": 1.0 - kept_f.mean().item()}
    if old_logp is not None and sampler_logp is not None:
        log_ratio = behaviour_log_ratio(old_logp, sampler_logp)               # log pi_old - log mu
        out["staleness/behaviour_kl"] = masked_mean(-log_ratio, mask).item()
        out["staleness/behaviour_k3"] = masked_mean(torch.exp(log_ratio.clamp(-20, 20)) - log_ratio - 1, mask).item()
    return out
