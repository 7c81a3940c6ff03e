"""sampling=replace: each zero-variance group of the batch overwritten by a copy of a varied one.

SkyRL's `handle_replace_sampling` (dynamic_sampling.type=replace, after POLARIS): when more
than `min_replace_ratio` of a batch's groups have reward variance (the sampling rounds, through
the option's filter, resample the batch until that holds), each flat group's rows are written
over, row for row, by the rows of a varied group drawn without replacement (with replacement
when there are fewer varied groups than flat ones). The copy takes its source's prompt id, so
it joins the source's group: that group then has 2G rows (its mean is unchanged; its Bessel std
is sqrt(2 (G - 1) / (2G - 1)) of what it was), and the batch has one group fewer per copy.
SkyRL draws with numpy's global generator; here a generator seeded by (seed, step). No state
across steps: nothing is checkpointed.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from grpo_ablate.sampling.decode import derived_seed, select_rows
from grpo_ablate.spec import RunSpec
from grpo_ablate.train.plugin import Plugin


def replacement_rows(group_index: torch.Tensor, flat: list[int], varied: list[int], generator) -> torch.Tensor:
    """[rows] the row each row is copied from: flat groups' rows from a drawn varied group's, in order."""
    if len(varied) >= len(flat):
        chosen = torch.randperm(len(varied), generator=generator)[:len(flat)]
    else:
        chosen = torch.randint(len(varied), (len(flat),), generator=generator)
    source = torch.arange(len(group_index))
    for bad, good in zip(flat, chosen.tolist()):
        bad_rows = (group_index == bad).nonzero().squeeze(1)
        good_rows = (group_index == varied[good]).nonzero().squeeze(1)
        n = min(len(bad_rows), len(good_rows))
        source[bad_rows[:n]] = good_rows[:n]
    return source


class ReplaceFlatGroups(Plugin):
    """sampling=replace's plugin: the batch's flat groups overwritten by copies of varied ones."""

    def __init__(self, min_replace_ratio: float, seed: int):
        self.min_replace_ratio, self.seed = min_replace_ratio, seed

    def after_sampling(self, batch, step: int, pad_id: int):
        index, scores = batch.group_index, batch.scores.double()
        groups = int(index.max()) + 1
        high = torch.full((groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, index, scores, "amax")
        low = torch.full((groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, index, scores, "amin")
        varied = (high > low).nonzero().squeeze(1).tolist()
        flat = [g for g in range(groups) if g not in set(varied)]
        if not flat or not len(varied) > groups * self.min_replace_ratio:
            return batch
        generator = torch.Generator().manual_seed(derived_seed(self.seed, ("replace", step)))
        source = replacement_rows(index, flat, varied, generator)
        joined = index[source]                                  # a copy joins its source's group
        remaining = torch.unique(joined)                        # the groups left, in order
        new_index = torch.searchsorted(remaining, joined)
        roll = select_rows(batch.roll, source.to(batch.roll.sequences.device))
        return replace(batch, roll=roll, problems=[batch.problems[g] for g in remaining.tolist()],
                       texts=[batch.texts[i] for i in source.tolist()], scores=batch.scores[source],
                       group_index=new_index, replaced=len(flat))

    def metrics(self, batch) -> dict:
        return {"sampling/replaced_groups": batch.replaced}


def replace_flat_groups(spec: RunSpec, task, policies) -> ReplaceFlatGroups | None:
    """The plugin when the sampling option replaces flat groups, else None."""
    sampling = spec.tricks["sampling"]
    if not sampling.option.replaces_flat_groups:
        return None
    return ReplaceFlatGroups(float(sampling.values["min_replace_ratio"]), spec.seed)
