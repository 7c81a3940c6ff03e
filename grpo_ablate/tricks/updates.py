"""Family `updates`: how many optimizer steps one rollout feeds (config only: the trainer reads it).

`updates.epochs` passes over the rollout, each in `updates.mini_batches` optimizer steps on
disjoint, seeded-shuffled slices of whole groups (verl's PPO mini-batches, `ppo_epochs`; TRL's
`steps_per_generation`, `num_iterations`). With one step per rollout pi_old is the policy
itself and the ratio is exactly 1; from the second step on it moves, and the ratio-based tricks
can act. No function of its own: see GRPOTrainer.update (train/step.py).
"""
from __future__ import annotations

from grpo_ablate.tricks.registry import FLAG, POSITIVE_INT, Activity, Trick, declare, declare_family

declare_family("updates", "optimizer steps per rollout: `updates.mini_batches` slices of whole groups × "
               "`updates.epochs` passes", stage="optimizer", default="single", metric="clip/low_frac",
               settings={"mini_batches": POSITIVE_INT, "epochs": POSITIVE_INT, "shuffle": FLAG})

RATIO_MOVES = Activity("ppo/kl")   # how far off-policy the optimizer steps were (0 with one step)


def _slices_of_whole_groups(cfg) -> str | None:
    """A mini-batch is whole groups: more mini-batches than a step's groups would quietly run fewer."""
    slices, groups = cfg.updates.mini_batches, cfg.rollout.prompts_per_step
    return None if slices <= groups else (
        f"updates.mini_batches={slices} is more than the {groups} groups of a step (rollout.prompts_per_step): "
        f"a mini-batch holds whole groups, so it would run {groups} optimizer steps; give mini_batches <= {groups}")


declare("updates", "single", checks=_slices_of_whole_groups)
declare("updates", "multi", activity=RATIO_MOVES, checks=_slices_of_whole_groups,
        tricks=(Trick("multi_update",
                      what="two passes over each rollout, an optimizer step each (the ratio and clipping act)",
                      source="TRL num_iterations; verl ppo_epochs (updates.epochs=2)",
                      verdict="not_applicable",
                      cost="+1 pi_old forward and +1 forward/backward per step"),))
declare("updates", "mini_batches", activity=RATIO_MOVES, checks=_slices_of_whole_groups,
        tricks=(Trick("mini_batches",
                      what="4 optimizer steps per rollout on disjoint shuffled quarters of its groups (the ratio "
                           "and clipping act)",
                      source="verl ppo_mini_batch_size; TRL steps_per_generation",
                      verdict="not_applicable",
                      cost="+1 pi_old forward per step; the same forward/backward work in 4 smaller pieces"),))
