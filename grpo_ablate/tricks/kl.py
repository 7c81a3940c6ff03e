"""Family `kl`: per-token KL estimators toward the reference policy, and the beta controller.

With log r = log pi_ref - log pi_theta per token (Schulman, "Approximating KL Divergence"):
    k1 = -log r            unbiased; as a loss on on-policy samples its expected gradient is 0
    k2 = 0.5 (log r)^2     its gradient is the reverse-KL gradient
    k3 = (r - 1) - log r   unbiased and >= 0; its gradient is the forward-KL gradient
Reference: verl core_algos `kl_penalty` (kl / mse / low_var_kl); TRL `_compute_loss` uses k3.
log r is clamped to [-20, 20] before exp, as verl does.
"""
from __future__ import annotations

import torch

LOG_RATIO_LIMIT = 20.0


def k1(logp, ref_logp):
    return logp - ref_logp


def k2(logp, ref_logp):
    return 0.5 * (ref_logp - logp) ** 2


def k3(logp, ref_logp):
    log_r = (ref_logp - logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return torch.exp(log_r) - 1.0 - log_r


KL_ESTIMATORS = {"k1": k1, "k2": k2, "k3": k3}


class FixedKL:
    """beta stays where the config put it (GRPO: 0.04; `kl=none` is beta 0, no reference)."""

    def __init__(self, beta: float = 0.0, **_):
        self.beta = float(beta)

    def update(self, measured_kl: float, num_sequences: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"beta": self.beta}

    def load_state_dict(self, state: dict) -> None:
        self.beta = float(state["beta"])


KL_CONTROLLERS = {"none": FixedKL, "fixed": FixedKL}
