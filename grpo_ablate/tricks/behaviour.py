"""The sampler's (behaviour policy mu's) log-probs as every trick reads them: one rule for unknown values.

An engine may report no log-prob for a token (vLLM returns None, recorded as NaN) or an infinite
one. Such a value is unknown, not a probability: every reader takes the log-prob it compares mu
with (pi_old, or the current policy where that is the comparison) in its place, so the token
counts as on-policy there -- importance ratio 1, no mismatch, never masked, pi_prox = pi_old.
TRL does the same for its importance weights (a NaN log-ratio becomes 0) and AReaL's rejection
sampling zeroes non-finite log-ratios; AReaL's proximal approximation would raise instead, and
proximal=loglinear here once read a NaN as log mu = 0 (mu = 1).
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs


def known_or(sampler_logp: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """The sampler's log-probs where they are finite, `fallback`'s elsewhere (same shape)."""
    return torch.where(torch.isfinite(sampler_logp), sampler_logp, fallback)


def log_ratio(logp: torch.Tensor, sampler_logp: torch.Tensor) -> torch.Tensor:
    """log(pi / mu) per token, 0 where mu's log-prob is unknown (a NaN of logp's own also reads 0)."""
    return torch.nan_to_num(logp - known_or(sampler_logp, logp), nan=0.0)
