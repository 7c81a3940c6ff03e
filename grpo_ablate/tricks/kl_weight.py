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

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.conditions import one_forward_statistic
from grpo_ablate.tricks.registry import (NON_NEGATIVE, POSITIVE, POSITIVE_INT, Inert, Trick, declare_family,
                                         register)

declare_family("kl_weight", "per-token weights on the KL term", stage="loss", default="uniform", metric="kl/k3")


def _needs_kl_term(cfg):
    if cfg.kl.beta > 0:
        return None
    return (f"kl_weight={cfg.kl_weight.name} weights the KL term, but kl={cfg.kl.name} has none; "
            "use kl=fixed, adaptive or adaptive_target")


@register("kl_weight", "uniform")
def uniform_kl_weight(mask: torch.Tensor, entropy: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(mask)


@register("kl_weight", "length_budget",
          what="tokens past `budget` get KL weight 1 + alpha * (t - budget) / budget",
          knobs={"budget": POSITIVE_INT, "alpha": NON_NEGATIVE},
          checks=_needs_kl_term,
          inert=Inert(lambda cfg: int(cfg.kl_weight.budget) >= int(cfg.rollout.max_new_tokens) - 1,
                      "cannot act: no completion is longer than kl_weight.budget",
                      "set kl_weight.budget below rollout.max_new_tokens", "completions longer than kl_weight.budget"),
          tricks=(Trick("token_weighted_kl",
                        what="KL weighted up for tokens past a length budget (needs a KL term: kl=fixed or "
                             "adaptive)",
                        source="seed review, paper 3 (model-free form; no framework has it)",
                        verdict="use_with_care",
                        cost="none beyond the KL term's reference forward"),))
def length_budget_kl_weight(mask, entropy, *, budget: int = 16, alpha: float = 1.0):
    position = torch.arange(mask.shape[1], dtype=mask.dtype, device=mask.device)
    return (1 + alpha * (position - budget).clamp(min=0) / budget).expand_as(mask)


@register("kl_weight", "entropy",
          what="KL weight proportional to token entropy, mean 1 over the batch",
          knobs={"eps": POSITIVE.but(neutral=1e-8)},   # came after runs existed: hashed away from its default
          checks=(_needs_kl_term, one_forward_statistic("kl_weight=entropy's mean entropy")))
def entropy_kl_weight(mask, entropy, *, eps: float = 1e-8):
    h = entropy.detach().to(mask.dtype) * mask
    return h / (h.sum() / mask.sum().clamp(min=1) + eps)

