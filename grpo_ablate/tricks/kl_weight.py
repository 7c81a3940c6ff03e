"""Family `kl_weight`: per-token weights on the KL term (seed review, paper 3: token-weighted /
dynamic KL regularization). The paper scores tokens with an auxiliary model; these are its
cheap, model-free forms. No framework has them.

`uniform`: w = 1.
`length_budget`: w_t = 1 + alpha * max(0, t - b) / b for token position t (0-based) past a
budget b, so tokens that stretch a long chain are held closer to pi_ref.
`entropy`: w proportional to the token's entropy, normalised to mean 1 over the batch's
completion tokens (uncertain tokens are regularized more).
"""
from __future__ import annotations

import torch

from grpo_ablate.tricks.registry import register


@register("kl_weight", "uniform")
def uniform_kl_weight(mask: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(mask)


@register("kl_weight", "length_budget")
def length_budget_kl_weight(mask, entropy, *, budget: int = 16, alpha: float = 1.0):
    position = torch.arange(mask.shape[1], dtype=mask.dtype, device=mask.device)
    return (1 + alpha * (position - budget).clamp(min=0) / budget).expand_as(mask)


@register("kl_weight", "entropy")
def entropy_kl_weight(mask, entropy, *, eps: float = 1e-8):
    h = entropy.detach().to(mask.dtype) * mask
    return h / (h.sum() / mask.sum().clamp(min=1) + eps)

