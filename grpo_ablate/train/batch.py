"""How a step's batch is formed: groups of completions per prompt, and the mini-batches of an update.

    TaskPrompts       the default prompt source: the task's own order
    SampledGroups     one step's groups: the rollout, the prompts, the texts and verifier scores
    sample_groups     the `sampling` family's rounds (static, dynamic, zero_variance, ...) from a
                      prompt source (the task's order, or a plugin's pool), then dynamic_group's growth
    mini_batch_rows   the rows of each PPO mini-batch of one pass over the rollout (whole groups)
    micro_batches     the consecutive slices of a rank's rows that go through one forward and
                      backward each (updates.micro_batch_size, updates.max_tokens_per_forward)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpo_ablate.sampling.decode import Rollout, concat_rollouts, select_rows
from grpo_ablate.sampling.engines import Rollouts
from grpo_ablate.config.spec import BoundOption
from grpo_ablate.tricks.adv.group import group_mean_std
from grpo_ablate.tricks.sampling import keep_all_groups, round_prompts


class TaskPrompts:
    """The default prompt source: the task's own training order (seeded by seed, step and round)."""

    def __init__(self, task, seed: int):
        self.task, self.seed = task, seed

    def draw(self, n: int, step: int, sampling_round: int) -> tuple[list, None]:
        return self.task.train_batch(n, self.seed, step, sampling_round), None

    def observe(self, indices, scores) -> None:
        return None


@dataclass
class SampledGroups:
    roll: Rollout
    problems: list           # one per group
    texts: list[str]         # one per row
    scores: torch.Tensor     # [rows] the verifier's rewards
    group_index: torch.Tensor  # [rows] row -> group (groups may be ragged)
    rounds: int
    sampled_tokens: int = 0  # every completion token generated for this batch, kept or not (compute)
    drawn: int = 0           # prompts drawn over the rounds, kept or not (0: rounds x B, every round B)
    replayed: int = 0        # groups replaced from the replay buffer (sampling=replay)
    replaced: int = 0        # flat groups replaced by copies of the batch's varied ones (sampling=replace)
    # [rows] bool: the rows the loss trains on, when the sampling option masks groups out of it rather
    # than dropping them (`masks_groups`: variance_mass); None: every row
    trained: torch.Tensor | None = None


def mini_batch_rows(group_index: torch.Tensor, mini_batches: int, shuffle_seed: int | None) -> list:
    """The row indices of each mini-batch of one pass: whole groups, shuffled by a generator
    seeded with `shuffle_seed` (keyed by seed, step and epoch: a resumed run draws the same),
    split into `mini_batches` slices of as equal a number of groups as can be (fewer slices
    when there are fewer groups). One slice: [None], the whole batch in its own order."""
    groups = int(group_index.max()) + 1
    n = min(mini_batches, groups)
    if n == 1:
        return [None]
    order = torch.arange(groups)
    if shuffle_seed is not None:
        order = torch.randperm(groups, generator=torch.Generator().manual_seed(shuffle_seed))
    return [torch.isin(group_index, chunk).nonzero().squeeze(1) for chunk in order.tensor_split(n)]


def micro_batches(tokens: list[int], size: int | None, max_tokens: int | None) -> list[slice]:
    """Consecutive slices of the rows whose real token counts are `tokens`: each holds at most
    `size` rows and at most `max_tokens` tokens (verl's dynamic batch size, in order; a row longer
    than the budget goes alone). Neither set: [slice(None)], every row in one forward."""
    if size is None and max_tokens is None:
        return [slice(None)]
    pieces, start, held = [], 0, 0
    for row, n in enumerate(tokens):
        full = (size is not None and row - start == size) or (max_tokens is not None and held + n > max_tokens)
        if full and row > start:
            pieces.append(slice(start, row))
            start, held = row, 0
        held += n
    return pieces + [slice(start, len(tokens))]


def sample_groups(rollouts: Rollouts, prompts, B: int, G: int, sampling: BoundOption, step: int,
                  T: float) -> SampledGroups:
    """The batch of groups for one optimizer step, per the `sampling` family's option.

    Round r draws fresh prompts x G completions (B, or ceil(over_sample x B) in the first
    round, and as the refill setting says in later ones: `round_prompts`); the family's filter
    (told how many groups the batch still needs) keeps groups (static: all; dynamic: those with
    reward variance) until B are kept or max_rounds is reached, and then trains on what was
    kept (the last round's first B groups if nothing was). Groups whose rewards
    are all equal then grow by g_step completions up to g_max (dynamic_group; otherwise
    g_max = G and nothing grows). With a prompt pool (prompt_pool family) the prompts come from
    it (`prompts`: a source with draw/observe, train/state/prompt_pool.py) and every round's groups,
    kept or not, update its pass rates. An option that masks groups (`masks_groups`: variance_mass)
    keeps every group of its one round, and its filter then says which groups the loss trains on
    (`SampledGroups.trained`). Raises NonFiniteLogits if the policy has diverged.
    """
    max_rounds, refill = int(sampling.values["max_rounds"]), sampling.values.get("refill")
    masks = sampling.option.masks_groups
    n = math.ceil(float(sampling.values.get("over_sample") or 1) * B)   # the first round's prompts
    rolls, problems, texts, scores, rounds, sampled_tokens, drawn, credit = [], [], [], [], 0, 0, 0, 0
    for sampling_round in range(max_rounds):
        round_problems, indices = prompts.draw(n, step, sampling_round)
        graded = rollouts(round_problems, G, T, ("train", step, sampling_round))
        prompts.observe(indices, graded.scores.view(n, G))
        rounds, drawn = rounds + 1, drawn + n
        sampled_tokens += int(graded.roll.lengths.sum())   # dropped groups cost compute too
        judge = keep_all_groups if masks else sampling.bind(needed=B - len(problems))
        chosen = judge(graded.scores.view(n, G)).nonzero().squeeze(1)
        kept = chosen[:B - len(problems)]                # never more than B groups in total
        rows = (kept[:, None] * G + torch.arange(G)).reshape(-1)
        rolls.append(select_rows(graded.roll, rows.to(graded.roll.sequences.device)))
        problems += [round_problems[g] for g in kept.tolist()]
        texts += [graded.texts[r] for r in rows.tolist()]
        scores.append(graded.scores[rows])
        if len(problems) == B:
            break
        n, credit = round_prompts(refill, B, B - len(problems), n - len(chosen), credit)
    if not problems:                                     # nothing kept: the last round's first B groups
        rows = torch.arange(min(n, B) * G)
        rolls, problems = [select_rows(graded.roll, rows.to(graded.roll.sequences.device))], round_problems[:B]
        texts, scores = graded.texts[:len(rows)], [graded.scores[rows]]
    group_index = torch.arange(len(problems)).repeat_interleave(G)
    batch = SampledGroups(concat_rollouts(rolls, rollouts.pad_id), problems, texts, torch.cat(scores), group_index,
                          rounds, sampled_tokens, drawn=drawn)
    if masks:   # whole groups, the same rows on every rank (each samples the whole batch)
        batch.trained = sampling.fn(batch.scores.view(len(problems), G))[group_index]
    return grow_groups(rollouts, sampling, G, step, T, batch)


def grow_groups(rollouts: Rollouts, sampling: BoundOption, G: int, step: int, T: float,
                batch: SampledGroups) -> SampledGroups:
    """dynamic_group: groups whose rewards are all equal get g_step more completions at a time,
    up to g_max (without sampling.g_max, g_max = G and nothing grows)."""
    g_step = int(sampling.values.get("g_step") or 1)
    g_max = int(sampling.values.get("g_max") or G)
    rolls, texts, scores, group_index = [batch.roll], list(batch.texts), [batch.scores], batch.group_index
    n_groups, growth, sampled_tokens = len(batch.problems), 0, batch.sampled_tokens
    while True:
        _, spread = group_mean_std(torch.cat(scores), group_index)
        sizes = torch.bincount(group_index, minlength=n_groups)
        varied = torch.zeros(n_groups, dtype=torch.bool).index_fill_(0, group_index[spread > 0], True)
        grow = ((~varied) & (sizes < g_max)).nonzero().squeeze(1).tolist()
        if not grow:
            break
        growth += 1
        more = rollouts([batch.problems[g] for g in grow], g_step, T, ("grow", step, growth))
        rolls.append(more.roll)
        sampled_tokens += int(more.roll.lengths.sum())
        texts += more.texts
        scores.append(more.scores)
        group_index = torch.cat([group_index, torch.tensor(grow).repeat_interleave(g_step)])
    if growth == 0:
        return batch
    return SampledGroups(concat_rollouts(rolls, rollouts.pad_id), batch.problems, texts, torch.cat(scores),
                         group_index, batch.rounds, sampled_tokens, drawn=batch.drawn)
