"""Family `staleness`: rollouts sampled by an older policy, as asynchronous RL trains on them.

Every framework that overlaps generation with training trains on completions that a policy
some optimizer steps behind sampled. On one machine that lag can be reproduced exactly: the
trainer keeps the last weights and samples each group with the policy of its *age* (how many
policy versions behind the trained one; a version is one GRPO step, i.e. one optimizer step
with updates.mini_batches=1). Every option takes (groups, oldest, generator) -- the number of
groups sampled in one call, the oldest age the trainer has weights for, and a torch.Generator
seeded by (seed, step, round) -- and returns (ages [groups] long, keep [groups] bool): the age
each group is sampled at (never above `oldest`) and whether it is trained on (False: dropped
as too old, its compute still spent).

    none    ages 0: synchronous GRPO (the trainer takes the very same path as without the family)
    fixed   every group at age k (verl one-step-off: k = 1; AReaL `rollout.max_head_offpolicyness`
            at its bound, which a saturated rollout buffer reaches)
    mixed   a fraction `stale_frac` of the groups at age k, the rest fresh (verl fully-async
            `async_training.staleness_threshold`: the share of stale samples in a batch)
    spread  ages uniform in 0..k, as rollouts in flight across k weight updates arrive; groups
            older than `max_age` are dropped (prime-rl `orchestrator.max_off_policy_steps`,
            TRL AsyncGRPO `max_staleness`: stale samples discarded)

An age is clamped to the history there is (at step 1 only the start: every group is fresh, as
an asynchronous run starts from the initial weights), before the drop rule sees it; the draws depend only
on (seed, step, round), so a resumed run samples what the uninterrupted one does.

Behaviour vs proximal policy (AReaL's terms, areal/trainer/ppo/actor.py `grpo_loss_fn`): the
behaviour policy mu is the one that sampled (its log-probs are recorded while sampling:
`sampler_logp`); the proximal policy pi_prox is the trained one before this rollout's update
(the trainer's pi_old, recomputed by a forward whenever staleness acts; family `proximal`
chooses how it is obtained). The corrections that pair with staleness read both: the PPO ratio
is taken against pi_prox and `rollout_correction` weighs the loss by pi_prox / mu (TIS,
`decoupled`: AReaL's decoupled PPO, `m2po`), `off_policy_mask` drops far-off negative sequences.
Metrics (`staleness/*`): the mean and max age trained on, the stale and dropped fractions of the
groups and the mismatch KL(mu || pi_prox) per token (k1 and k3 estimators, on mu's samples).
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import (FRACTION, POSITIVE_INT, Activity, Claim, Inert, Allowed, Trick, choice,
                                         declare_family, register)

declare_family("staleness", "rollouts from the policy of k steps ago (asynchronous RL, reproduced exactly): "
               "`fixed` k (verl one-step-off, AReaL max_head_offpolicyness), `mixed` (a stale fraction, verl "
               "fully-async), `spread` 0..k with groups older than `max_age` dropped (prime-rl)", stage="async",
               metric="staleness/mean_age")

STALE_ACTS = Activity("staleness/mean_age")


def _model_cannot_be_swapped(cfg) -> bool:
    return cfg.rollout.backend != "hf" or bool(cfg.model.get("fsdp"))


def _check_swappable(cfg):
    """The stale weights are loaded into the policy while it samples: the hf backend, unsharded."""
    if _model_cannot_be_swapped(cfg):
        return ("samples with the policy's own older weights: needs rollout=hf and model.fsdp=false "
                "(vLLM and sharded weights are not swapped)")
    return None


def _no_stale_group(cfg) -> bool:
    return cfg.staleness.name == "mixed" and float(cfg.staleness.stale_frac) == 0


NEVER_STALE = Inert(_no_stale_group, "cannot act: stale_frac=0 samples every group with the current policy",
                    "set staleness.stale_frac above 0", "staleness.stale_frac > 0")


@register("staleness", "none",
          what="synchronous GRPO: every group sampled by the policy being trained (no weight history is kept)")
def synchronous(groups: int, oldest: int, generator: torch.Generator):
    """Every group sampled by the current policy (age 0), every group kept."""
    return torch.zeros(groups, dtype=torch.long), torch.ones(groups, dtype=torch.bool)


@register("staleness", "fixed",
          what="every group sampled by the policy of k steps ago (verl one-step-off: k=1; AReaL "
               "max_head_offpolicyness)",
          notes={"k": "policy versions behind (one GRPO step each); k weight snapshots are kept"},
          stale=True, needs_old_forward=True, knobs={"k": POSITIVE_INT}, activity=STALE_ACTS, checks=_check_swappable,
          tricks=(Trick("stale_rollouts",
                        what="rollouts from the policy of k steps ago (k=1: one-step-off asynchronous RL)",
                        source="verl one_step_off_policy (docs/advance/one_step_off.md); AReaL "
                               "rollout.max_head_offpolicyness",
                        verdict="not_in_review",
                        cost="k weight snapshots; a pi_old forward per step",
                        claims=(Claim("does not hurt", "", "AReaL (arXiv 2505.24298)",
                                      "staleness up to 4-8 matches synchronous accuracy with the decoupled "
                                      "objective"),)),))
def fixed_lag(groups: int, oldest: int, generator: torch.Generator, *, k: int = 1):
    """Every group at age k (no draw)."""
    return torch.full((groups,), min(int(k), oldest), dtype=torch.long), torch.ones(groups, dtype=torch.bool)


@register("staleness", "mixed",
          what="a fraction of the groups sampled by the policy of k steps ago, the rest fresh (verl fully-async "
               "async_training.staleness_threshold)",
          notes={"stale_frac": "each group stale with this probability (seeded by seed, step, round)"},
          stale=True, needs_old_forward=True, knobs={"k": POSITIVE_INT, "stale_frac": FRACTION},
          activity=Activity("staleness/stale_frac"), inert=NEVER_STALE, checks=_check_swappable,
          tricks=(Trick("mixed_staleness",
                        what="a fraction of each batch's groups from the policy of k steps ago, the rest fresh",
                        source="verl fully_async async_training.staleness_threshold (docs/advance/fully_async.md)",
                        verdict="not_in_review", cost="k weight snapshots; a pi_old forward per step"),))
def mixed_ages(groups: int, oldest: int, generator: torch.Generator, *, k: int = 1, stale_frac: float = 0.5):
    """Each group independently stale (age k) with probability stale_frac, else fresh."""
    stale = torch.rand(groups, generator=generator) < float(stale_frac)
    return stale.long() * min(int(k), oldest), torch.ones(groups, dtype=torch.bool)


def _wait_needs_a_bound(cfg):
    if cfg.staleness.get("strategy", "drop") == "wait" and cfg.staleness.get("max_age") is None:
        return "staleness.strategy=wait caps the ages at staleness.max_age, which is null: give max_age (verl's " \
               "max_off_policy_threshold - 1)"
    return _check_swappable(cfg)


def capped_ages(ages: torch.Tensor, max_age: int | None, strategy: str = "drop"):
    """(ages, keep) under verl's staleness control with threshold T = max_age + 1 (a group spans
    age + 1 policy versions from its sampling to its training: verl's global_steps - its step + 1).
    `drop`: a group spanning more than T versions is dropped (verl replay_buffer
    `_drop_max_off_policy_samples`: > T). `wait`: the trainer does not step while an in-flight group
    has reached T (verl `_has_enough_samples`: >= T blocks sampling), so no group is trained older
    than max_age: its age is capped there and it is kept. None: every group kept as drawn."""
    if strategy not in ("drop", "wait"):
        raise ValueError(f"staleness.strategy={strategy!r} is not allowed; allowed: drop, wait")
    if max_age is None:
        return ages, torch.ones_like(ages, dtype=torch.bool)
    if strategy == "wait":
        return ages.clamp(max=int(max_age)), torch.ones_like(ages, dtype=torch.bool)
    return ages, ages <= int(max_age)


@register("staleness", "spread",
          what="group ages uniform in 0..k, as rollouts in flight across k updates arrive (PipelineRL, prime-rl)",
          notes={"max_age": "groups older than this are dropped (prime-rl max_off_policy_steps; null keeps all)",
                 "strategy": "drop | wait (verl max_off_policy_strategy; its max_off_policy_threshold = max_age + 1)"},
          stale=True, needs_old_forward=True,
          knobs={"k": POSITIVE_INT, "max_age": Allowed("integer", low=0, high="staleness.k", optional=True,
                                                    note="groups older than it are dropped; null keeps all"),
                 "strategy": choice("drop", "wait")},
          activity=STALE_ACTS, checks=_wait_needs_a_bound,
          tricks=(Trick("spread_staleness",
                        what="group ages uniform in 0..k (rollouts in flight over k updates); older than max_age "
                             "dropped",
                        source="prime-rl orchestrator.max_off_policy_steps; TRL AsyncGRPO max_staleness; PipelineRL; "
                               "verl trainer.v1.sampler max_off_policy_threshold (max_age + 1), strategy drop",
                        verdict="not_in_review",
                        cost="k weight snapshots; a pi_old forward per step; dropped groups' sampling"),
                  Trick("staleness_wait",
                        what="group ages uniform in 0..4, none trained older than 2: the trainer waits for them "
                             "instead of dropping them",
                        source="verl trainer.v1.sampler max_off_policy_threshold=3 max_off_policy_strategy=wait",
                        verdict="not_in_review",
                        cost="k weight snapshots; a pi_old forward per step; the trainer's wait (not simulated)",
                        settings={"k": 4, "max_age": 2, "strategy": "wait"})))   # verl max_off_policy_threshold = 3
def spread_ages(groups: int, oldest: int, generator: torch.Generator, *, k: int = 4, max_age: int | None = None,
                strategy: str = "drop"):
    """Ages drawn uniformly from 0..k (then clamped to `oldest`); those older than max_age dropped
    (`strategy: drop`) or trained at max_age (`wait`); None: all kept (`capped_ages`).

    verl's staleness control (trainer.v1.sampler.max_off_policy_threshold T, max_off_policy_strategy;
    verl/trainer/v1 replay buffer) is this with max_age = T - 1. Difference: on one machine nothing
    runs while the trainer waits, so `wait` costs no time here; in verl it stalls training."""
    ages = torch.randint(0, int(k) + 1, (groups,), generator=generator).clamp(max=oldest)
    return capped_ages(ages, max_age, strategy)
