"""Family `rollout_correction`, the TV-divergence filter: one option (`tv_filter`, open-instruct's
`rho_mask_tv_divergence`) whose mask reads the advantages. Split from weights.py (the
importance weights) because it is the family's one option that reads more than (old_logp,
sampler_logp, mask): the trainer supplies `advantages` (the family's supplied knob) to an option
with the `reads_advantages` flag, and computes its weights after the advantage chain, not before
(train/step.py `rewards_and_advantages`). It shares weights.py's conventions (verl's
mismatch metrics) and its inert rule.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.behaviour import log_ratio as behaviour_log_ratio
from grpo_ablate.tricks.registry import Activity, Allowed, Inert, Trick, option, register
from grpo_ablate.tricks.rollout_correction.weights import SAMPLER_IS_TRAINER, masked_mean, mismatch_metrics

TV_LOG_RATIO_LIMIT = 10.0   # open-instruct compute_rho_correction clamps log pi_old - log mu to [-10, 10]


def _reads_the_weights_first(cfg) -> str | None:
    """An estimator that reads the correction weights (OTB: its token energy times rho-bar^2) needs them
    before the advantages; this option needs the advantages before its weights."""
    adv = cfg.get("adv")
    if adv is None or not option("adv", adv.name).reads_token_energy:
        return None
    return (f"rollout_correction={cfg.rollout_correction.name} computes its weights from the advantages, and "
            f"adv={adv.name} reads those weights to compute the advantages: pick one (another rollout_correction "
            "option, or another estimator)")


def _filters_nothing(cfg) -> bool:
    return cfg.rollout_correction.get("high") is None and cfg.rollout_correction.get("low") is None


NO_TV_BOUND = Inert(_filters_nothing, "cannot filter: with rollout_correction.high and .low both null no sequence's "
                    "tokens are masked, and what is left is the clamped rho weight of a token-level correction",
                    "give rollout_correction.high (or .low)", "rollout_correction.high or .low set")


@register("rollout_correction", "tv_filter",
          what="TV-divergence rho filtering (open-instruct rho_mask_tv_divergence, VACO): where a sequence's mean "
               "abs(rho - 1) lies outside [low, high], mask its tokens whose sign(log pi_old - log mu) * A > 0; the "
               "rest weighted by rho clamped to [clamp_low, clamp_high]",
          notes={"high": "open-instruct rho_mask_upper_bound, on the sequence's mean TV (its test's 2.0; null: none)",
                 "low": "open-instruct rho_mask_lower_bound (0 there: none)",
                 "clamp_high": "open-instruct rho_clamp_upper_bound (null: no clamp)",
                 "clamp_low": "open-instruct rho_clamp_lower_bound (0 there: none)"},
          needs_sampler_logprobs=True, needs_old_forward=True, weighs_by_ratio=True, reads_advantages=True,
          knobs={"high": Allowed(low=0, low_open=True, optional=True),
                 "low": Allowed(low=0, low_open=True, high="rollout_correction.high", optional=True),
                 "clamp_high": Allowed(low=1, low_open=True, optional=True),
                 "clamp_low": Allowed(low=0, low_open=True, high=1, high_open=True, optional=True)},
          activity=Activity("rollout_corr/logp_diff_mean"),   # the kept tokens' weights differ from 1
          inert=(SAMPLER_IS_TRAINER, NO_TV_BOUND), checks=_reads_the_weights_first,
          tricks=Trick("tv_rho_filter",
                       what="mask the tokens that would raise the sampler-trainer TV divergence of a sequence whose "
                            "mean abs(pi_old / mu - 1) exceeds 2; the rest weighted by pi_old / mu clamped at 2",
                       source="open-instruct 61afa0412 (#1681) rho_mask_tv_divergence (grpo_utils.py "
                              "compute_rho_correction); VACO (arXiv 2603.01365)",
                       verdict="not_in_review", cost="a pi_old forward per step"))
def tv_filter_weights(old_logp, sampler_logp, mask, *, advantages=None, high: float | None = 2.0,
                      low: float | None = None, clamp_high: float | None = 2.0, clamp_low: float | None = None):
    """TV-divergence rho filtering (open-instruct 61afa0412, #1681, grpo_utils.py `compute_rho_correction`
    with use_rho_correction and rho_mask_tv_divergence; VACO, arXiv 2603.01365). Per token, on the trained
    tokens (d = 0 elsewhere):

        d_t   = clamp(log pi_old_t - log mu_t, -10, 10)          rho_t = exp(d_t)
        TV_i  = mean_t |rho_t - 1|  over sequence i's trained tokens
        drop_t = (TV_i < low or TV_i > high) and sign(d_t) * A_t > 0    (low/high None: that side unbounded)
        w_t   = 0 where drop_t, else clamp(rho_t, clamp_low, clamp_high)

    A token is dropped only where it would raise the TV (rho > 1 with A > 0, or rho < 1 with A < 0: the
    update pushes pi further from mu); sign(0) = 0 keeps a token with d = 0 or A = 0. The weight is
    the token's own rho (open-instruct's rho_mask_sequence_level=False, its default). `advantages`
    [N, 1] or [N, T] is supplied by the trainer (the loss's advantages, after adv_clip); None reads
    as all 0: nothing dropped. open-instruct's bounds are 0 for "none", here None. Metrics: the
    fractions of trained tokens dropped (`masked_frac`, `masked_low_frac`, `masked_high_frac`) and
    clamped (`clipped_frac`, open-instruct val/rho_clipfrac), the sequences' mean TV (`tv_mean`,
    `tv_max`, over non-empty sequences), the weights' mean / max / min and verl's mismatch metrics.
    Hand case (open-instruct's test): pi_old = (.25, 1, 4), (4, 4, 4) against mu = 1, A = 1, high 2,
    no clamp: TV = 1.25, 3 -> weights (.25, 1, 4), (0, 0, 0)."""
    with torch.no_grad():
        mask_f = mask.to(old_logp.dtype)
        trained = mask_f > 0
        diff = behaviour_log_ratio(old_logp, sampler_logp).clamp(-TV_LOG_RATIO_LIMIT, TV_LOG_RATIO_LIMIT) * mask_f
        rho = torch.exp(diff)
        tokens = mask_f.sum(dim=-1, keepdim=True)
        tv = ((rho - 1.0).abs() * mask_f).sum(dim=-1, keepdim=True) / tokens.clamp(min=1)   # [N, 1]
        adv = torch.zeros_like(diff) if advantages is None else advantages.to(diff.dtype).expand_as(diff)
        raises_tv = (torch.sign(diff) * adv > 0) & trained
        too_low = (tv < low) & raises_tv if low is not None else torch.zeros_like(trained)
        too_high = (tv > high) & raises_tv if high is not None else torch.zeros_like(trained)
        clamped = rho if clamp_low is None and clamp_high is None else rho.clamp(min=clamp_low, max=clamp_high)
        weights = torch.where(too_low | too_high, torch.zeros_like(clamped), clamped) * mask_f
        live = tokens.squeeze(-1) > 0
        kept = weights[trained & ~(too_low | too_high)]
        metrics = {"rollout_corr/masked_frac": masked_mean((too_low | too_high).to(diff.dtype), mask_f).item(),
                   "rollout_corr/masked_low_frac": masked_mean(too_low.to(diff.dtype), mask_f).item(),
                   "rollout_corr/masked_high_frac": masked_mean(too_high.to(diff.dtype), mask_f).item(),
                   "rollout_corr/clipped_frac": masked_mean((clamped != rho).to(diff.dtype), mask_f).item(),
                   "rollout_corr/tv_mean": tv.squeeze(-1)[live].mean().item() if live.any() else 0.0,
                   "rollout_corr/tv_max": tv.squeeze(-1)[live].max().item() if live.any() else 0.0,
                   "rollout_corr/is_mean": masked_mean(weights, mask_f).item(),
                   "rollout_corr/is_max": kept.max().item() if kept.numel() else 0.0,
                   "rollout_corr/is_min": kept.min().item() if kept.numel() else 0.0}
        metrics.update(mismatch_metrics(old_logp, sampler_logp, mask_f))
        return weights, metrics
