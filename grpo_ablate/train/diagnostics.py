"""Gradient-conflict diagnostics: do the loss terms and reward components pull the same way?

Each loss term's gradient alone, and the policy term's driven by each reward component alone, on
one sub-batch and the same weights: `grad_norm/<term>` = ||g_term|| (weighted as in the loss) and
`grad_cos/<a>__<b>` = <g_a, g_b> / (||g_a|| ||g_b||). Only torch here: pure functions on tensors
and autograd, no model code, no I/O. Design: docs/diagnostics.md#which-terms-fight-diaggrad_conflicttrue
"""
from __future__ import annotations

import itertools
from typing import Callable, Mapping, Sequence

import torch


# ------------------------------------------------------------------------------ the math
def flat_grad(loss: torch.Tensor, params: Sequence[torch.Tensor]) -> torch.Tensor:
    """d loss / d params, flattened into one float64 vector (zeros for parameters the loss does
    not reach). The graph is kept, so the next term can be differentiated on the same forward."""
    grads = torch.autograd.grad(loss, list(params), retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).double()
                      for g, p in zip(grads, params)])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """Cosine similarity of two flattened gradients, in float64; None when either is zero
    (a term that does not move the weights has no direction)."""
    a, b = a.reshape(-1).double(), b.reshape(-1).double()
    norms = a.norm() * b.norm()
    if norms == 0 or not torch.isfinite(norms):
        return None
    return float((a @ b) / norms)


def conflict_metrics(grads: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """`grad_norm/<term>` for every gradient and `grad_cos/<a>__<b>` for every pair, in the
    order given; a pair with a zero gradient has no cosine and is left out. Zero up to rounding:
    a norm within 64 ulps of the largest term's (a KL term at the step where pi_theta is pi_ref
    is exactly 0 or rounding, as the forwards happen to be summed), else its direction is noise."""
    metrics = {f"grad_norm/{name}": float(g.norm()) for name, g in grads.items()}
    scale = max((float(g.norm()) for g in grads.values()), default=0.0)
    rounding = {name: float(g.norm()) <= 64 * torch.finfo(g.dtype).eps * scale for name, g in grads.items()}
    for (a, ga), (b, gb) in itertools.combinations(grads.items(), 2):
        value = None if rounding[a] or rounding[b] else cosine(ga, gb)
        if value is not None:
            metrics[f"grad_cos/{a}__{b}"] = value
    return metrics


def term_gradients(terms: Mapping[str, torch.Tensor], params: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The flattened gradient of each scalar loss term alone (one backward each, graph kept)."""
    return {name: flat_grad(loss, params) for name, loss in terms.items()}


def component_advantages(components: Mapping[str, torch.Tensor],
                         advantage_of: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
    """The advantage each reward component would give if it were the whole reward, through
    the run's own advantage function (reward_norm -> estimator -> adv_clip). Components that
    are zero on every completion add nothing and are left out; the first one (the task
    reward) is always kept, so its term is logged even on a batch where it carries no signal.
    A reward with no other component is not split at all (its one component would just
    repeat the policy term).

    The estimators are not linear (GRPO divides by the group's std), so the components'
    advantages need not add up to the total's: each says where that reward alone would push.
    """
    out = {}
    for i, (name, reward) in enumerate(components.items()):
        if i == 0 or bool((reward != 0).any()):
            out[name] = advantage_of(reward)
    return out if len(out) > 1 else {}


# ------------------------------------------------------------------------------ bounding the cost
def pick_rows(group_index: torch.Tensor, informative: torch.Tensor, rows: int | None) -> torch.Tensor:
    """Row indices of the sub-batch the diagnostics run on: whole groups, those with some
    nonzero advantage first (a group whose rewards are all equal has no policy gradient, and
    50-70% of the embedded default's groups are like that), in batch order, until `rows`
    completions are reached (always at least one group). None = every row."""
    if rows is None or rows >= group_index.numel():
        return torch.arange(group_index.numel())
    n_groups = int(group_index.max()) + 1
    has_signal = torch.zeros(n_groups, dtype=torch.bool).index_fill_(0, group_index[informative], True)
    order = torch.cat([has_signal.nonzero().squeeze(1), (~has_signal).nonzero().squeeze(1)])
    chosen, count = [], 0
    for g in order.tolist():
        size = int((group_index == g).sum())
        if chosen and count + size > rows:
            break
        chosen.append(g)
        count += size
    keep = torch.zeros(n_groups, dtype=torch.bool)
    keep[chosen] = True
    return keep[group_index].nonzero().squeeze(1)


def decoder_blocks(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The model's stack of transformer blocks: its ModuleList holding the most parameters
    (`model.layers` in Llama/Qwen2, `transformer.h` in GPT-2), found without naming either."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        return None
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


def last_layer_params(model: torch.nn.Module, last_layers: int | None) -> list[torch.Tensor]:
    """The trainable parameters of the last `last_layers` transformer blocks (None: every
    trainable parameter). A backward restricted to them stops there, which bounds the cost;
    the embeddings, final norm and LM head are not included (a tied LM head would pull the
    backward through every layer again)."""
    blocks = decoder_blocks(model) if last_layers else None
    if blocks is None:
        return [p for p in model.parameters() if p.requires_grad]
    return [p for block in list(blocks)[-int(last_layers):] for p in block.parameters() if p.requires_grad]
