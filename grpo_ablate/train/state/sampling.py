"""The sampling family's state: sampling=replay's buffer, and sampling=replace's rewrite of the batch.

sampling=replay: a buffer of informative groups that refills the batch's zero-variance ones.

TRL's `GRPOWithReplayBufferTrainer` (trl/experimental/grpo_with_replay_buffer): every group with
reward variance enters the buffer scored by sum_j |A_j| * std_g (A the group-normalized
advantage, eps 1e-4 as TRL's), which keeps the `size` best-scored groups; then every group of
the batch without variance is replaced by a group drawn from the buffer with probability
proportional to its score (with replacement only when more are needed than it holds). The
buffer is updated before it is drawn from, so a step may replay its own groups, as TRL's does.

Replayed rows keep what they were sampled with (their completions, the verifier's scores and
the sampler's log-probs, i.e. an older behaviour policy) and carry their age in steps
(`Rollout.ages`, so `staleness/*` reports it); their advantages are recomputed from the stored
rewards, which for a group statistic is what TRL stores. The draws come from a generator
seeded by (seed, step); the buffer is checkpointed with the run.

sampling=replace: each zero-variance group of the batch overwritten by a copy of a varied one.

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

import heapq
from dataclasses import replace

import torch

from grpo_ablate.sampling.decode import concat_rollouts, derived_seed, select_rows
from grpo_ablate.config.spec import RunSpec
from grpo_ablate.train.state import Plugin, stateful


class ReplayBuffer(Plugin):
    """sampling=replay's plugin: the buffer, applied to every sampled batch (`after_sampling`)."""
    key = "replay_buffer"

    def __init__(self, size: int, seed: int):
        self.size, self.seed = size, seed
        self.heap = []          # min-heap of (score, tie, group): group = a dict of the group's rows
        self.added = 0          # a tie-breaker: heapq never compares the groups themselves

    def add(self, score: float, group: dict) -> None:
        entry = (score, self.added, group)
        self.added += 1
        if len(self.heap) < self.size:
            heapq.heappush(self.heap, entry)
        elif score > self.heap[0][0]:
            heapq.heapreplace(self.heap, entry)

    def draw(self, n: int, step: int) -> list[dict]:
        scores = torch.tensor([e[0] for e in self.heap], dtype=torch.float64)
        generator = torch.Generator().manual_seed(derived_seed(self.seed, ("replay", step)))
        chosen = torch.multinomial(scores, n, replacement=n > len(self.heap), generator=generator)
        return [self.heap[i][2] for i in chosen.tolist()]

    def after_sampling(self, batch, step: int, pad_id: int):
        """The batch with its zero-variance groups replaced from the buffer (after adding its informative ones)."""
        scores, index = batch.scores.double(), batch.group_index
        groups = int(index.max()) + 1
        counts = torch.bincount(index, minlength=groups).double()
        mean = torch.zeros(groups, dtype=torch.float64).index_add_(0, index, scores) / counts
        var = torch.zeros(groups, dtype=torch.float64).index_add_(0, index, (scores - mean[index]) ** 2)
        std = (var / (counts - 1).clamp(min=1)).sqrt()
        advantage = (scores - mean[index]) / (std[index] + 1e-4)
        flat = [g for g in range(groups) if std[g] == 0]
        for g in range(groups):
            if std[g] > 0:
                rows = (index == g).nonzero().squeeze(1)
                self.add(float(advantage[rows].abs().sum() * std[g]), self._group(batch, g, rows, step))
        if not flat or not self.heap:
            return batch
        replayed = self.draw(len(flat), step)
        keep = [g for g in range(groups) if std[g] > 0]
        rows = torch.isin(index, torch.tensor(keep, dtype=index.dtype)).nonzero().squeeze(1)
        fresh = select_rows(batch.roll, rows.to(batch.roll.sequences.device))
        if fresh.ages is None:          # (stale rollouts carry their own)
            fresh.ages = torch.zeros(len(rows), dtype=torch.long, device=fresh.sequences.device)
        olds = []
        for group in replayed:
            roll = group["roll"].to(batch.roll.sequences.device)
            roll.ages = torch.full((len(group["texts"]),), step - group["step"], dtype=torch.long,
                                   device=roll.sequences.device)
            olds.append(roll)
        problems = [batch.problems[g] for g in keep] + [group["problem"] for group in replayed]
        sizes = [int((index == g).sum()) for g in keep] + [len(group["texts"]) for group in replayed]
        new_index = torch.arange(len(problems)).repeat_interleave(torch.tensor(sizes))
        texts = [batch.texts[i] for i in rows.tolist()] + [t for group in replayed for t in group["texts"]]
        new_scores = torch.cat([batch.scores[rows]] + [group["scores"] for group in replayed])
        roll = concat_rollouts([fresh, *olds] if len(rows) else olds, pad_id)
        return replace(batch, roll=roll, problems=problems, texts=texts, scores=new_scores, group_index=new_index,
                       replayed=len(flat))

    @staticmethod
    def _group(batch, g: int, rows, step: int) -> dict:
        roll = select_rows(batch.roll, rows.to(batch.roll.sequences.device)).to("cpu")
        roll.ages = roll.kept = roll.queued = None
        return {"roll": roll, "problem": batch.problems[g], "texts": [batch.texts[i] for i in rows.tolist()],
                "scores": batch.scores[rows].cpu(), "step": step}

    def metrics(self, batch) -> dict:
        return {"sampling/replayed_groups": batch.replayed}

    def state_dict(self) -> dict:
        return {"heap": list(self.heap), "added": self.added}

    def load_state_dict(self, state: dict) -> None:
        self.heap, self.added = list(state["heap"]), state["added"]


@stateful("sampling")
def replay_buffer(spec: RunSpec, task, policies) -> ReplayBuffer | None:
    """The buffer when the sampling option replays groups, else None."""
    sampling = spec.tricks["sampling"]
    if not sampling.option.replays:
        return None
    return ReplayBuffer(int(sampling.values["size"]), spec.seed)


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


@stateful("sampling")
def replace_flat_groups(spec: RunSpec, task, policies) -> ReplaceFlatGroups | None:
    """The plugin when the sampling option replaces flat groups, else None."""
    sampling = spec.tricks["sampling"]
    if not sampling.option.replaces_flat_groups:
        return None
    return ReplaceFlatGroups(float(sampling.values["min_replace_ratio"]), spec.seed)
