"""Family `token_mask`: which trained tokens the policy loss keeps, chosen per step.

Every option takes (entropy [N, T], mask [N, T]) and returns the new mask [N, T] (floats, a
subset of `mask`, no gradient); the trainer multiplies the policy loss by it, so a dropped
token gets exactly zero policy gradient. Flag `selects_tokens`: the option may drop tokens (the
trainer skips the identity `none`).

`high_entropy` ("Beyond the 80/20 Rule", arXiv 2506.01939; TRL `top_entropy_quantile`):
keep the tokens whose entropy is in the top `quantile` of the batch's trained tokens,
    threshold = quantile_{1 - quantile}(entropy of the trained tokens)   (linear interpolation)
    keep_t = mask_t and entropy_t >= threshold
Reference: TRL `get_high_entropy_mask` (torch.quantile over the tokens of all ranks; applied in
`_compute_loss`); the paper recommends 0.2. The trainer passes the whole batch's entropies
(every rank's) so the threshold is global, as in TRL. The quantile is computed by sorting,
which matches torch.quantile's default and has no size limit (torch.quantile stops at 2^24).
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import FRACTION, Activity, Inert, Trick, declare_family, register

declare_family("token_mask", "the policy loss on the top-quantile-entropy tokens only", stage="loss",
               metric="token_mask/dropped_frac")


@register("token_mask", "none",
          what="every trained token is in the policy loss")
def keep_all_tokens(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return mask


def linear_quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """The q-quantile of a 1-D tensor with linear interpolation (torch.quantile's default)."""
    ordered = values.sort().values
    position = q * (ordered.numel() - 1)
    low = int(position // 1)
    high = min(low + 1, ordered.numel() - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


@register("token_mask", "high_entropy",
          what="Beyond the 80/20 Rule (arXiv 2506.01939): the policy loss keeps only the tokens whose entropy is in "
               "the top `quantile` of the batch's trained tokens (TRL top_entropy_quantile; the paper uses 0.2)",
          selects_tokens=True,
          knobs={"quantile": FRACTION},
          activity=Activity("token_mask/dropped_frac"),
          inert=Inert(lambda cfg: float(cfg.token_mask.quantile) >= 1,
                      "cannot act with token_mask.quantile=1 (every token is kept)",
                      "set token_mask.quantile below 1 (0.2)", "token_mask.quantile < 1"),
          tricks=(Trick("high_entropy_mask",
                        what="train only the top-20% entropy tokens of the batch",
                        source="TRL top_entropy_quantile (Beyond the 80/20 Rule, arXiv 2506.01939)",
                        verdict="not_in_review",
                        cost="none (the entropy is computed anyway)"),))
def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, *, quantile: float = 0.2) -> torch.Tensor:
    """Keep the top `quantile` of trained tokens by entropy (1.0 keeps all, 0.0 only the maximum)."""
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"token_mask.quantile={quantile!r} is not allowed; it must lie in [0, 1]")
    with torch.no_grad():
        trained = entropy[mask > 0].float()
        if trained.numel() == 0:
            return torch.zeros_like(mask)
        threshold = linear_quantile(trained, 1.0 - quantile)
        return ((entropy.float() >= threshold) & (mask > 0)).to(mask.dtype)
