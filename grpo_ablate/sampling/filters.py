"""Sampling filters (rollout.top_k, rollout.top_p, rollout.min_p) and the kept set they leave.

A filtered sampler draws from the tempered distribution truncated to a *kept set* and
renormalised over it; its log-probs are that renormalised distribution's (vLLM's
processed_logprobs). A trainer that recomputes log pi over the full vocabulary then scores
another distribution: every importance ratio carries the kept mass (TRL #6789). So the sampler
records each token's kept set (`Rollout.kept_ids`) and, with rollout.sampling_replay, the
trainer's forward renormalises over the same set (slime's top-p mask, DeepSeek-V3.2's "keep
sampling mask", prime-rl's sampling replay): train/forward.py.

Order, as transformers' logits processors apply them: top-k, then top-p on what top-k left
(renormalised), then min-p (relative to the most probable token, so renormalising does not move
it). The most probable token is always kept. vLLM applies its own order; the set it reports is
what is replayed, so the trainer never re-derives the filter.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

NOT_KEPT = -1   # the fill of a kept-id list shorter than the batch's widest


@dataclass(frozen=True)
class SamplingFilters:
    top_k: int = 0        # keep the k most probable tokens (0: off)
    top_p: float = 1.0    # then the fewest most probable tokens holding at least this mass (1: off)
    min_p: float = 0.0    # then those at least min_p times the most probable's probability (0: off)

    @property
    def truncates(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0


def kept_mask(probs: torch.Tensor, filters: SamplingFilters) -> torch.Tensor:
    """[rows, V] bool: the tokens each row's filters keep, from its tempered probabilities."""
    keep = torch.ones_like(probs, dtype=torch.bool)
    if filters.top_k > 0 and filters.top_k < probs.shape[-1]:
        kth = probs.topk(filters.top_k, dim=-1).values[:, -1:]
        keep &= probs >= kth                          # ties at the k-th probability kept (as HF's TopK)
    if filters.top_p < 1.0:
        kept_probs = torch.where(keep, probs, torch.zeros_like(probs))
        kept_probs = kept_probs / kept_probs.sum(dim=-1, keepdim=True)
        ascending, order = kept_probs.sort(dim=-1)
        # HF and vLLM: drop the tail whose cumulative mass is at most 1 - top_p; the top token stays
        drop_sorted = ascending.cumsum(dim=-1) <= 1.0 - filters.top_p
        drop_sorted[:, -1] = False
        keep &= ~drop_sorted.scatter(-1, order, drop_sorted)
    if filters.min_p > 0.0:
        top = probs.max(dim=-1, keepdim=True).values
        keep &= probs >= filters.min_p * top
    return keep


def kept_ids(keep: torch.Tensor) -> torch.Tensor:
    """[rows, K] int32: the kept token ids of each row ([rows, V] bool), K the widest set, NOT_KEPT
    after. A rollout holds N x T x K of them: with top_p alone K can reach the vocabulary at a flat
    token, so rollout.top_k bounds it (prime-rl defaults top_k to 512 when it truncates)."""
    counts = keep.sum(dim=-1)
    width = max(int(counts.max()) if counts.numel() else 0, 1)
    ids = torch.arange(keep.shape[-1], device=keep.device).expand_as(keep)
    # kept ids first (a stable sort of the not-kept flag), the rest NOT_KEPT
    order = (~keep).to(torch.int8).argsort(dim=-1, stable=True)[:, :width]
    picked = ids.gather(-1, order)
    return torch.where(torch.arange(width, device=keep.device) < counts[:, None], picked,
                       torch.full_like(picked, NOT_KEPT)).to(torch.int32)


def replay_mask(kept: torch.Tensor, vocab: int) -> torch.Tensor:
    """[..., V] bool from [..., K] kept ids (NOT_KEPT ignored); a position with no kept id (after EOS,
    or a sampler that did not truncate there) keeps the whole vocabulary."""
    index = torch.where(kept == NOT_KEPT, torch.full_like(kept, vocab), kept).long()
    mask = torch.zeros((*kept.shape[:-1], vocab + 1), dtype=torch.bool, device=kept.device)
    mask.scatter_(-1, index, True)
    mask = mask[..., :vocab]
    return mask | ~mask.any(dim=-1, keepdim=True)
