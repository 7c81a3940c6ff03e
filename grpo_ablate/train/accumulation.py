"""What an optimizer step's micro-batches share and leave behind.

One optimizer step (a mini-batch) may run its forward and backward in several micro-batches
(updates.micro_batch_size, updates.max_tokens_per_forward: consecutive runs of a rank's rows,
train/batch.py `micro_batches`). The gradients add up in `.grad`; each micro-batch's loss is
its rows' share of the mini-batch's loss (the loss_agg weights are the mini-batch's), so their
sum is the unsplit loss. The forwards' per-row outputs are stitched back to the mini-batch's
rows, and every metric is computed on them as if there had been one forward.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass
class Update:
    """What a rollout's optimizer steps leave for the metrics."""
    loss: float              # the steps' losses (each the whole mini-batch's, over ranks), averaged
    grad_norm: float         # averaged over the steps
    finite: bool             # False: a step's loss or grad norm was not finite (and was not skipped)
    steps: int               # optimizer steps taken on this rollout
    logp: torch.Tensor       # [N, T] every row's log-probs from its last forward (the last pass)
    entropy: torch.Tensor    # [N, T] likewise
    values: torch.Tensor | None
    step_means: dict         # token statistics (clip fractions, ratio, critic loss), over the steps


@contextlib.contextmanager
def scaled_lr(optimizer, scale: float):
    """Every parameter group's learning rate times `scale` for one optimizer step, then restored."""
    rates = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * scale
    try:
        yield
    finally:
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate


def accumulating(model, last: bool):
    """The context of one micro-batch's backward: DDP holds its gradient all-reduce until the
    mini-batch's last one (it then reduces the sum; a rank may have one micro-batch more than
    another), everything else backpropagates as it is."""
    return model.no_sync() if hasattr(model, "no_sync") and not last else contextlib.nullcontext()


def stitched(pieces: list):
    """The micro-batches' outputs, each a tuple (tensors, None, or a dict of tensors) over its
    rows, as one output over all their rows (consecutive slices: concatenated in order)."""
    if len(pieces) == 1:
        return pieces[0]

    def joined(parts):
        if parts[0] is None:
            return None
        if isinstance(parts[0], dict):
            return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}
        return torch.cat(parts)
    return tuple(joined(list(parts)) for parts in zip(*pieces))


class LastPass:
    """Every row's log-probs, entropy and values from the last forward that saw it: the
    policy as it was trained on this rollout, for the metrics."""

    def __init__(self, mask):
        self.mask, self.logp, self.entropy, self.values = mask, None, None, None

    def put(self, rows, logp, entropy, values) -> None:
        if rows is None:   # the whole batch in one forward
            self.logp, self.entropy, self.values = logp, entropy, values
            return
        for name, value in (("logp", logp), ("entropy", entropy), ("values", values)):
            if value is None:
                continue
            if getattr(self, name) is None:
                setattr(self, name, torch.zeros(self.mask.shape, dtype=value.dtype, device=value.device))
            getattr(self, name)[rows] = value.detach()
