"""The template-collapse diagnostic (RAGEN-2, arXiv 2604.06268): do the completions still depend on the prompt?

Entropy measures how varied the completions of one prompt are; it can stay steady while the policy
stops reading its input and answers every prompt from one template ("template collapse"). What
this measures instead: the batch's own completions y, sampled for their prompts x, scored under
their own prompt and under another group's prompt x' of the same batch,

    d(y) = log pi(y | x) - log pi(y | x')          (summed over y's tokens: `_seq`; per token: the mean)

and averaged over a sub-batch. Its expectation, E_{x, x'} KL(pi(.|x) || pi(.|x')), is zero exactly when
pi(.|x) = pi(.|x') for every pair of the batch's prompts (the policy ignores its input), and is an
upper bound of the mutual information I(X; Y) under the batch's prompts (E_x' KL(p_x || p_x') >=
KL(p_x || mean_x' p_x') by convexity). RAGEN's CollapseDetector (ragen/trainer/collapse_metrics.py)
scores every completion under every prompt of the batch and logs log pi(y|x) - log mean_j pi(y|x_j),
a lower-variance estimate at N times the cost; this one forward of one other prompt per completion
keeps the diagnostic within a few percent of a step (benchmarks/input_dependence_overhead.py).

The sub-batch (diag.input_dependence_rows completions) takes the groups' completions in turns, the
first of each group, then the second, ...; each row's other prompt is the next group's (in batch order,
the last group's the first's), so x' is never x's own group. Two groups with the same prompt text
(a task that repeats a problem) contribute 0 for that pair. Only torch here: pure functions.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from grpo_ablate.sampling.decode import Rollout, select_rows


def pick_rows(group_index: torch.Tensor, rows: int | None) -> torch.Tensor:
    """[n] the sub-batch's rows: each group's first completion (groups in batch order), then each
    group's second, ..., the first `rows` of that order (None: every row), in batch order."""
    index = group_index.cpu()
    rank = torch.zeros_like(index)            # a row's place within its group
    for g in torch.unique(index).tolist():
        members = (index == g).nonzero().squeeze(1)
        rank[members] = torch.arange(len(members))
    order = sorted(range(len(index)), key=lambda r: (int(rank[r]), int(index[r])))
    chosen = order if rows is None else order[:rows]
    return torch.tensor(sorted(chosen), dtype=torch.long)


def other_prompt_rows(group_index: torch.Tensor, picked: torch.Tensor) -> torch.Tensor | None:
    """[n] for each picked row, a row of the next group of the batch (the first group's after the last):
    the prompt it is scored under. None when the batch has one group (no other prompt)."""
    index = group_index.cpu()
    groups = torch.unique(index)
    if len(groups) < 2:
        return None
    first_row = torch.stack([(index == g).nonzero()[0, 0] for g in groups])
    position = torch.searchsorted(groups, index[picked])
    return first_row[(position + 1) % len(groups)]


def with_prompts_of(roll: Rollout, rows: torch.Tensor, donors: torch.Tensor) -> Rollout:
    """The completions of `rows` after the prompts of `donors`: each row's left-padded prompt block
    (the first prompt_len columns, and its attention mask) is the donor's. A row's tokens stay one
    contiguous run (the prompt ends where the completion starts), so positions and packing are as
    for any row."""
    device = roll.sequences.device
    own, other = select_rows(roll, rows.to(device)), select_rows(roll, donors.to(device))
    P = roll.prompt_len
    return replace(own, sequences=torch.cat([other.sequences[:, :P], own.sequences[:, P:]], dim=1),
                   attention_mask=torch.cat([other.attention_mask[:, :P], own.attention_mask[:, P:]], dim=1))


def input_dependence_metrics(own: torch.Tensor, other: torch.Tensor, mask: torch.Tensor) -> dict:
    """`diag/input_dependence`: the mean over rows of each completion's per-token mean of
    log pi(y_t | x, y_<t) - log pi(y_t | x', y_<t) (nats per token: comparable across lengths; the
    health flag reads it); `diag/input_dependence_seq`: the mean of their sums (nats per completion,
    the KL estimate above). own, other, mask: [n, T] (mask: the completion's tokens). Float64."""
    mask = mask.bool()
    diff = torch.where(mask, own.double() - other.double(), 0.0)   # a padded position may hold -inf
    per_completion = diff.sum(dim=1)
    per_token = per_completion / mask.sum(dim=1).clamp(min=1)
    return {"diag/input_dependence": float(per_token.mean()), "diag/input_dependence_seq": float(per_completion.mean())}
