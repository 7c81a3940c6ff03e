"""The loss of a GRPO step, written once: per-token terms by name, then one aggregation.

    policy    the policy loss of the `clip` family (PPO clipped surrogate, dual-clip, ...)
    value     value_coef * the critic's loss (`value_clip`), with a critic (adv=gae)
    kl        beta * KL(pi || pi_ref) per token (`kl.estimator`), weighted by `kl_weight`
    kl_prev   beta_prev * KL(pi || pi_prev) (kl=two_layer)
    entropy   -c * H, the entropy bonus (`entropy`), while c > 0

The update minimizes sum_jt w_jt * (sum of the terms), w the `loss_agg` weights; the
gradient-conflict diagnostics differentiate each term alone. Both call `LossTerms`, so a
term added here is in the update and in the diagnostics alike.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from omegaconf import DictConfig

from grpo_ablate.config import trick
from grpo_ablate.tricks import option


@dataclass
class LossInputs:
    """What the loss needs besides the forward's outputs: per-row tensors of the batch (or of
    some of its rows). None where the run has no such anchor."""
    mask: torch.Tensor                      # [N, T] the trained tokens
    advantages: torch.Tensor                # [N, 1] per completion or [N, T] per token
    old_logp: torch.Tensor | None = None    # pi_old (None: pi_old is the policy itself, rho = 1)
    ref_logp: torch.Tensor | None = None    # pi_ref, the frozen start
    prev_logp: torch.Tensor | None = None   # pi_prev, the policy prev_lag steps ago (two-layer KL)
    old_values: torch.Tensor | None = None  # V_old, the critic before this rollout's updates
    returns: torch.Tensor | None = None     # the critic's targets

    def rows(self, index) -> "LossInputs":
        """The same inputs for some rows (a slice or an index tensor)."""
        return LossInputs(**{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[index]
                             for f in fields(self)})


@dataclass(frozen=True)
class Coefficients:
    """This step's weights of the terms (adaptive controllers change them between steps)."""
    kl: float          # beta of the KL term in the loss (0: no term; kl=in_reward charges the reward)
    kl_prev: float     # beta_prev of the two-layer KL
    entropy: float     # c of the entropy bonus
    value: float       # value_coef of the critic's loss


class LossTerms:
    """The loss tricks of a run, bound once; called with a forward's outputs and LossInputs."""

    def __init__(self, cfg: DictConfig):
        self.policy_loss = trick(cfg, "clip", dual_clip_c=cfg.dual_clip.c)
        self.kl_estimator = option("kl.estimator", cfg.kl.estimator).impl
        self.kl_weight = trick(cfg, "kl_weight")
        self.value_loss = trick(cfg, "value_clip")

    def policy(self, logp, old_logp, advantages, mask):
        """(per-token policy loss, per-token clip statistics); old_logp None: rho = 1."""
        return self.policy_loss(logp, logp.detach() if old_logp is None else old_logp, advantages, mask)

    def __call__(self, logp, entropy, values, inputs: LossInputs, coef: Coefficients):
        """({term name: per-token loss [N, T]}, {metric name: per-token statistic}). The raw
        critic loss is a statistic too (`value/loss`), before value_coef weighs it."""
        old_logp = logp.detach() if inputs.old_logp is None else inputs.old_logp
        policy, stats = self.policy(logp, old_logp, inputs.advantages, inputs.mask)
        terms = {"policy": policy}
        if values is not None:
            stats["value/loss"] = self.value_loss(values, inputs.old_values, inputs.returns)
            terms["value"] = coef.value * stats["value/loss"]
        if inputs.ref_logp is not None and coef.kl > 0:
            terms["kl"] = coef.kl * (self.kl_estimator(logp, inputs.ref_logp, old_logp) * self.kl_weight(inputs.mask, entropy))
        if inputs.prev_logp is not None and coef.kl_prev > 0:
            terms["kl_prev"] = coef.kl_prev * self.kl_estimator(logp, inputs.prev_logp, old_logp)
        if coef.entropy > 0:   # the entropy carries a gradient only then
            terms["entropy"] = -coef.entropy * entropy
        return terms, stats


def total(terms: dict) -> torch.Tensor:
    """The per-token loss: the terms added in their order (policy first)."""
    values = iter(terms.values())
    out = next(values)
    for term in values:
        out = out + term
    return out
