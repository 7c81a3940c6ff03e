"""Family `lr_scale`: the learning rate of one optimizer step, scaled by how off-policy its rows are.

Every option takes (old_logp, sampler_logp, mask) of one optimizer step's mini-batch -- pi_old's
log-probs [N, T] (the proximal policy under staleness), the sampler's (None: the sampler is
pi_old) and the trained tokens -- and returns (scale, metrics): the trainer multiplies every
parameter group's learning rate by `scale` for that step only (the schedule is untouched).

`ess` (VCPO, arXiv 2602.17616): with sequence importance weights w_i = pi_old(o_i) / mu(o_i),
    ESS = (sum_i w_i)^2 / (sum_i w_i^2 + 1e-8),   s = min(1, (ESS / n) / base_ess_ratio)
and the rate is lr * sqrt(s) (`rule: sqrt`, VCPO's default) or lr * s (`linear`): a step whose few
rows carry most of the weight is damped.
"""
from __future__ import annotations

from grpo_ablate.tricks.behaviour import log_ratio
from grpo_ablate.tricks.conditions import same_sampler_and_trainer
from grpo_ablate.tricks.registry import Activity, Claim, Inert, Allowed, Trick, choice, declare_family, register

declare_family("lr_scale", "the learning rate of each optimizer step scaled by the effective sample size of its "
               "sequence importance weights (VCPO)", stage="optimizer", metric="optim/lr_scale")

VCPO = "VCPO (Huang et al. 2026, arXiv 2602.17616)"


@register("lr_scale", "none",
          what="the learning rate as the schedule gives it")
def constant_lr(old_logp, sampler_logp, mask):
    return 1.0, {}


@register("lr_scale", "ess",
          what="VCPO: each optimizer step's learning rate scaled by the effective sample size of its sequence "
               "importance weights pi_old / mu",
          notes={"rule": "VCPO ess_scaling.scaling_rule: sqrt | linear",
                 "base_ess_ratio": "VCPO ess_scaling.base_ess_ratio: scale = min(1, (ESS/n) / base_ess_ratio)"},
          needs_sampler_logprobs=True, needs_old_forward=True,
          knobs={"rule": choice("sqrt", "linear"), "base_ess_ratio": Allowed(low=0, low_open=True, high=1)},
          activity=Activity("optim/lr_scale", "changes"),
          inert=Inert(same_sampler_and_trainer, "cannot act: the current policy samples in the trainer's dtype, so "
                      "every importance weight is 1 (ESS = n)", "add staleness=fixed (or rollout.dtype=bfloat16)",
                      "a sampler that differs from the trainer (staleness, rollout.dtype, vLLM)"),
          tricks=(Trick("vcpo_ess_lr",
                        what="each optimizer step's learning rate x sqrt(min(1, ESS/n)) of its sequence IS weights",
                        source="VCPO actor.ess_scaling (mit-han-lab/vcpo, arXiv 2602.17616)",
                        verdict="not_in_review", cost="none (pi_old's forward, which staleness already needs)",
                        claims=(Claim("helps", "", VCPO,
                                      "scaling the learning rate by the effective sample size (with its off-policy "
                                      "baseline) keeps asynchronous training stable, even 128 steps off-policy, "
                                      "where masking and clipping stabilizers collapse"),)),))
def ess_lr_scale(old_logp, sampler_logp, mask, *, rule: str = "sqrt", base_ess_ratio: float = 1.0):
    """VCPO's ESS learning-rate scaling (mit-han-lab/vcpo, commit c7f030f: recipe/fully_async_policy/
    staleness_utils.py `compute_ess_info`, verl/workers/actor/megatron_actor.py's ess_scaling block;
    ESSScalingConfig: scaling_rule sqrt, base_ess_ratio 1.0, use_clipped false). w_i =
    exp(sum_t log pi_old/mu) over the row's trained tokens (log-ratio clamped to [-20, 20]; an
    unknown mu log-prob reads as pi_old's, tricks/behaviour.py); rows without a trained token do
    not count. Over the whole mini-batch of the step, as VCPO gathers it over data-parallel ranks.
    Differences: VCPO's `use_clipped` (ESS of the truncated weights) is not offered. Its other half,
    the minimum-variance baseline from per-trajectory gradients (grad_baselining), is `adv=opob`.
    """
    if rule not in ("sqrt", "linear"):
        raise ValueError(f"lr_scale.rule={rule!r} is not allowed; allowed: sqrt, linear")
    if old_logp is None or sampler_logp is None:
        return 1.0, {"optim/ess_ratio": 1.0}
    rows = mask.sum(dim=1) > 0
    seq = (log_ratio(old_logp, sampler_logp) * mask).sum(dim=1).clamp(-20.0, 20.0)[rows].double().exp()
    if seq.numel() == 0:
        return 1.0, {"optim/ess_ratio": 1.0}
    ratio = float(seq.sum() ** 2 / (seq.pow(2).sum() + 1e-8)) / seq.numel()
    scale = min(1.0, ratio / float(base_ess_ratio))
    return (scale ** 0.5 if rule == "sqrt" else scale), {"optim/ess_ratio": ratio}
