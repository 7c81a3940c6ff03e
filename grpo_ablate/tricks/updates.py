"""Family `updates`: how many optimizer steps one rollout feeds (config only: the trainer reads it).

`updates.epochs` passes over the rollout, each in `updates.mini_batches` optimizer steps on
disjoint, seeded-shuffled slices of whole groups (verl's PPO mini-batches, `ppo_epochs`; TRL's
`steps_per_generation`, `num_iterations`). With one step per rollout pi_old is the policy
itself and the ratio is exactly 1; from the second step on it moves, and the ratio-based tricks
can act. No function of its own: see GRPOTrainer.update (train/step.py).

Each optimizer step's forward and backward may run in micro-batches (TRL's gradient
accumulation, verl's `ppo_micro_batch_size_per_gpu` and `use_dynamic_bsz`): consecutive runs of
a rank's rows, at most `updates.micro_batch_size` completions and at most
`updates.max_tokens_per_forward` real tokens (prompt and completion) each; gradients add up and
the optimizer steps once per mini-batch. Every normaliser (loss_agg's weights, token masks,
rollout correction, the overlong filter) is taken over the whole mini-batch before it is split,
so the loss, the gradient and the metrics do not depend on the split; an option whose statistic
is over one forward's rows refuses the split (`one_forward_statistic`). null: no split.
"""
from __future__ import annotations

from grpo_ablate.tricks.conditions import splits_forward
from grpo_ablate.tricks.registry import FLAG, POSITIVE_INT, Activity, Allowed, Trick, declare, declare_family

# the two micro-batch limits: a split changes how a step is computed, not what (tests/test_micro_batches.py),
# so a run that ran out of memory resumes split, and a split run is the unsplit run's config
SPLIT = Allowed("integer", low=1, optional=True, note="null: no split", resumable=True)
declare_family("updates", "optimizer steps per rollout: `updates.mini_batches` slices of whole groups × "
               "`updates.epochs` passes; each step's forward and backward in micro-batches of at most "
               "`updates.micro_batch_size` completions and `updates.max_tokens_per_forward` tokens",
               stage="optimizer", default="single", metric="clip/low_frac",
               settings={"mini_batches": POSITIVE_INT, "epochs": POSITIVE_INT, "shuffle": FLAG,
                         "micro_batch_size": SPLIT, "max_tokens_per_forward": SPLIT})

RATIO_MOVES = Activity("ppo/kl")   # how far off-policy the optimizer steps were (0 with one step)


def _slices_of_whole_groups(cfg) -> str | None:
    """A mini-batch is whole groups: more mini-batches than a step's groups would quietly run fewer."""
    slices, groups = cfg.updates.mini_batches, cfg.rollout.prompts_per_step
    return None if slices <= groups else (
        f"updates.mini_batches={slices} is more than the {groups} groups of a step (rollout.prompts_per_step): "
        f"a mini-batch holds whole groups, so it would run {groups} optimizer steps; give mini_batches <= {groups}")


def _one_forward_a_rank_under_fsdp(cfg) -> str | None:
    """FSDP gathers every block's shards at each forward, so all ranks must run as many forwards: a
    rank's micro-batches are counted on its own rows, which can differ by one (not supported yet)."""
    split = splits_forward(cfg)
    return None if split is None or not cfg.model.get("fsdp") else (
        f"{split} is not supported with model.fsdp=true (each rank would count its own micro-batches, and FSDP "
        "needs as many forwards on every rank); allowed: micro-batches with DDP or one process, or model.fsdp=false")


CHECKS = (_slices_of_whole_groups, _one_forward_a_rank_under_fsdp)
declare("updates", "single", checks=CHECKS)
declare("updates", "multi", activity=RATIO_MOVES, checks=CHECKS,
        tricks=(Trick("multi_update",
                      what="two passes over each rollout, an optimizer step each (the ratio and clipping act)",
                      source="TRL num_iterations; verl ppo_epochs (updates.epochs=2)",
                      verdict="not_applicable",
                      cost="+1 pi_old forward and +1 forward/backward per step"),))
declare("updates", "mini_batches", activity=RATIO_MOVES, checks=CHECKS,
        tricks=(Trick("mini_batches",
                      what="4 optimizer steps per rollout on disjoint shuffled quarters of its groups (the ratio "
                           "and clipping act)",
                      source="verl ppo_mini_batch_size; TRL steps_per_generation",
                      verdict="not_applicable",
                      cost="+1 pi_old forward per step; the same forward/backward work in 4 smaller pieces"),))
