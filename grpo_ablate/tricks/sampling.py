"""Family `sampling`: which sampled groups make up the batch of an optimizer step.

Each option is a group filter, scores [groups, G] (the verifier's rewards) -> keep [groups],
plus `max_rounds` in its config: the trainer samples fresh prompts round after round until
`prompts_per_step` groups are kept or the rounds run out, then proceeds with what it kept
(never crashing: verl raises here, which users hit in verl issues 953 and 1108).

`static`: every group is kept, one round.
`dynamic` (DAPO dynamic sampling; verl `filter_groups`, metric=acc): groups whose rewards are
all equal carry no group-relative signal and are dropped.
`dynamic_group` (seed review "dynamic group size"; no reference): every group is kept, and a
group whose rewards are all equal gets `g_step` more completions at a time, up to `g_max`
(the trainer does this for any option that sets g_max > group_size); advantages are then
computed on ragged groups.
"""
from __future__ import annotations

import torch

from grpo_ablate.tricks.registry import register


@register("sampling", "static")
@register("sampling", "dynamic_group")
def keep_all_groups(scores: torch.Tensor) -> torch.Tensor:
    return torch.ones(scores.shape[0], dtype=torch.bool)


@register("sampling", "dynamic")
def keep_varied_groups(scores: torch.Tensor) -> torch.Tensor:
    return scores.amax(dim=1) > scores.amin(dim=1)

