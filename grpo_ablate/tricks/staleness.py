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
    exact   ages split into in-flight (0..k) and in-queue (0..queue) parts; groups past max_age dropped,
            the queue time counted (prime-rl 2441fd514) or not (`bound=in_flight`, prime-rl before it)
    paced   groups at the pipeline's depth, a fraction of stragglers older (up to k), none trained past
            max_age: waited for, not dropped (tinker-cookbook PR #822; `strategy=drop`: before it)

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
groups and the mismatch KL(mu || pi_prox) per token (k1 and k3 estimators, on mu's samples); with
`exact`, the in-flight and in-queue parts of the trained ages (mean, max). An option may return a
third tensor, each group's in-queue part (`Rollout.queued`).

What has no counterpart on one machine: wall-clock time. Here the ages are drawn, not the outcome
of rollout durations, so they do not depend on the problem: dropping a group biases nothing toward
fast (easy) problems, as it does in tinker-cookbook and prime-rl; waiting costs no time; a dropped
group is masked, not replaced by a newly sampled one (prime-rl fills the batch, tinker requeued).
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import (FRACTION, POSITIVE_INT, Activity, Claim, Inert, Allowed, Trick, choice,
                                         declare_family, register)

declare_family("staleness", "rollouts from the policy of k steps ago (asynchronous RL, reproduced exactly): "
               "`fixed` k (verl one-step-off, AReaL max_head_offpolicyness), `mixed` (a stale fraction, verl "
               "fully-async), `spread` 0..k with groups older than `max_age` dropped (prime-rl), `exact` "
               "in-flight + in-queue ages (prime-rl 2441fd514), `paced` (tinker-cookbook #822: waited for, not "
               "dropped)", stage="async",
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


def _stale_groups_dropped(cfg) -> bool:
    """A bound of 0 that drops (not waits): every group older than the policy is dropped, so only fresh
    groups are trained; the stale ones were sampled for nothing (exact: with its total age bounded)."""
    s = cfg.staleness
    return (s.get("max_age") is not None and int(s.max_age) == 0 and s.get("strategy", "drop") == "drop"
            and s.get("bound", "total") == "total")


STALE_DROPPED = Inert(_stale_groups_dropped, "cannot act: max_age=0 drops every group older than the policy, so only "
                      "groups sampled by the current policy are trained (the stale ones' sampling is wasted)",
                      "set staleness.max_age above 0 (or, where the option has it, strategy=wait)",
                      "staleness.max_age > 0 (or strategy=wait)")


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
          activity=STALE_ACTS, inert=STALE_DROPPED, checks=_wait_needs_a_bound,
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


def oldest_age(values) -> int:
    """The oldest age an option's draws reach, so how many weight snapshots the run keeps: `k`, plus
    `queue` where the age has an in-queue part (`exact`)."""
    return int(values["k"]) + int(values.get("queue") or 0)


def _exact_all_fresh(cfg) -> bool:
    return cfg.staleness.name == "exact" and int(cfg.staleness.k) == 0 and int(cfg.staleness.queue) == 0


EXACT_ALL_FRESH = Inert(_exact_all_fresh, "cannot act: k=0 and queue=0 sample and train every group at once",
                        "set staleness.k or staleness.queue above 0", "staleness.k + staleness.queue > 0")


@register("staleness", "exact",
          what="group ages split into in-flight (weight updates during generation, 0..k) and in-queue (steps "
               "waiting once done, 0..queue) parts; groups past max_age dropped, queue time counted (prime-rl "
               "2441fd514)",
          notes={"k": "most weight updates during one group's generation (its in-flight part)",
                 "queue": "most steps a finished group waits before it is trained (its in-queue part)",
                 "max_age": "groups older than this are dropped (prime-rl max_off_policy_steps; null keeps all)",
                 "bound": "total (prime-rl 2441fd514: queue time counted) | in_flight (prime-rl before it: only "
                          "the in-flight part is bounded)"},
          stale=True, needs_old_forward=True,
          knobs={"k": Allowed("integer", low=0), "queue": Allowed("integer", low=0),
                 "max_age": Allowed("integer", low=0, optional=True,
                                    note="groups older than it are dropped; null keeps all"),
                 "bound": choice("total", "in_flight")},
          activity=STALE_ACTS, inert=(EXACT_ALL_FRESH, STALE_DROPPED), checks=_check_swappable,
          tricks=(Trick("exact_staleness",
                        what="rollouts in flight over 0..2 weight updates, then queued 0..2 steps; any group more "
                             "than 2 versions behind the trained policy, queue time included, dropped",
                        source="prime-rl orchestrator max_off_policy_steps with exact in-flight + in-queue "
                               "staleness (2441fd514, #3313)",
                        verdict="not_in_review",
                        cost="k + queue weight snapshots; a pi_old forward per step; dropped groups' sampling"),))
def exact_ages(groups: int, oldest: int, generator: torch.Generator, *, k: int = 2, queue: int = 2,
               max_age: int | None = 2, bound: str = "total"):
    """Each group's age is an in-flight part f ~ U{0..k} plus an in-queue part q ~ U{0..queue}:

        age = min(f + q, oldest),  in_flight = min(age, f),  in_queue = age - in_flight

    prime-rl 2441fd514 (#3313), orchestrator/utils.py `episode_staleness`: total = (step - 1) -
    policy.start, in_flight = min(total, policy.end - policy.start), in_queue = total - in_flight;
    `min_fresh_version` and the sink's `_drop_stale` void a group whose total exceeds
    max_off_policy_steps (`bound=total`). Before it (the dispatcher's `off_policy_steps` counter,
    bumped per weight update while a rollout ran) only the in-flight part was bounded
    (`bound=in_flight`): a group that finished fast and waited kept any in-queue age. A group is
    sampled whole by the policy at its start version (its age); in prime-rl the weights change
    under a running rollout, so its later tokens come from newer policies. Returns (ages, keep,
    in_queue), each [groups]."""
    flight = torch.randint(0, int(k) + 1, (groups,), generator=generator)
    queued = torch.randint(0, int(queue) + 1, (groups,), generator=generator)
    return split_ages(flight, queued, oldest, max_age, bound)


def split_ages(flight: torch.Tensor, queued: torch.Tensor, oldest: int, max_age: int | None, bound: str = "total"):
    """(ages, keep, in_queue) of groups whose generation spanned `flight` weight updates and that then
    waited `queued` steps: the total clamped to the history there is, the in-flight part at most
    the total (prime-rl `episode_staleness`), the bound on the total or on the in-flight part."""
    if bound not in ("total", "in_flight"):
        raise ValueError(f"staleness.bound={bound!r} is not allowed; allowed: total, in_flight")
    ages = (flight + queued).clamp(max=oldest)
    flight = torch.minimum(flight, ages)
    queued = ages - flight
    if max_age is None:
        return ages, torch.ones_like(ages, dtype=torch.bool), queued
    return ages, (ages if bound == "total" else flight) <= int(max_age), queued


def _paced_all_fresh(cfg) -> bool:
    s = cfg.staleness
    return s.name == "paced" and ((int(s.depth) == 0 and float(s.straggle_frac) == 0)
                                  or (int(s.max_age) == 0 and s.strategy == "wait"))


PACED_ALL_FRESH = Inert(_paced_all_fresh, "cannot act: every group is trained on the policy that sampled it "
                        "(depth=0 and no stragglers, or max_age=0 with strategy=wait: tinker's synchronous case)",
                        "set staleness.depth above 0 (and staleness.max_age with it)",
                        "staleness.depth > 0 or stragglers past max_age dropped")


@register("staleness", "paced",
          what="most groups at the pipeline's depth, stragglers older up to k; none trained older than max_age: "
               "the trainer waits for them instead of dropping them (tinker-cookbook PR #822)",
          notes={"depth": "how far sampling runs ahead of training: every group's age but the stragglers' "
                          "(tinker pipeline_depth)",
                 "straggle_frac": "each group a straggler with this probability: its rollout outlives the "
                                  "pipeline, age uniform in depth+1..k",
                 "max_age": "the bound: no group trained older (tinker max_steps_off_policy)",
                 "strategy": "wait (tinker #822: paced, trained at the deadline) | drop (tinker before #822: "
                             "discarded)"},
          stale=True, needs_old_forward=True,
          knobs={"k": POSITIVE_INT, "depth": Allowed("integer", low=0, high="staleness.max_age"),
                 "max_age": Allowed("integer", low=0, high="staleness.k"), "straggle_frac": FRACTION,
                 "strategy": choice("wait", "drop")},
          activity=STALE_ACTS, inert=(PACED_ALL_FRESH, STALE_DROPPED), checks=_check_swappable,
          tricks=(Trick("paced_staleness",
                        what="sampling one step ahead of training, a quarter of the groups stragglers up to 4 "
                             "steps old; none trained older than 2, none dropped (the trainer waits for them)",
                        source="tinker-cookbook PR #822 (branch async-rl-blocking-staleness 1975ad25): "
                               "AsyncConfig max_steps_off_policy, pipeline_depth",
                        verdict="not_in_review",
                        cost="k weight snapshots; a pi_old forward per step; the trainer's wait (not simulated)"),))
def paced_ages(groups: int, oldest: int, generator: torch.Generator, *, k: int = 4, depth: int = 1,
               max_age: int = 2, straggle_frac: float = 0.25, strategy: str = "wait"):
    """Each group a straggler with probability straggle_frac (drawn first), its age uniform in
    depth+1..k (drawn second, for every group); the others at `depth`; clamped to `oldest`, then
    `capped_ages(ages, max_age, strategy)`: `wait` trains a straggler past max_age at max_age, `drop`
    drops it.

    tinker-cookbook PR #822 (rl/train.py `_InFlightGroupTracker`, `collect_batch`, at 1975ad25):
    at most groups_per_batch * (pipeline_depth + 1) groups outstanding, so a fast sampler's groups
    are trained pipeline_depth steps after they were sampled; before step t the trainer waits for
    every rollout from version <= t - max_steps_off_policy and trains stalest-first, so a slow one
    is trained at its deadline, never dropped (`wait`). Before #822 such a group was discarded and
    its problem requeued (`drop`; here masked, not resampled, as `spread` drops)."""
    depth, k = int(depth), int(k)
    straggler = torch.rand(groups, generator=generator) < float(straggle_frac)
    slow = torch.randint(depth + 1, k + 1, (groups,), generator=generator) if k > depth \
        else torch.full((groups,), depth, dtype=torch.long)
    return paced_schedule(straggler, slow, depth, oldest, max_age, strategy)


def paced_schedule(straggler: torch.Tensor, slow: torch.Tensor, depth: int, oldest: int, max_age: int,
                   strategy: str = "wait"):
    """(ages, keep): a straggler at its own age `slow`, every other group at `depth`, clamped to the
    history, then waited for at max_age (`wait`) or dropped past it (`drop`)."""
    ages = torch.where(straggler, slow, torch.full_like(slow, int(depth))).clamp(max=oldest)
    return capped_ages(ages, max_age, strategy)
