"""Family `rollout_correction`: importance weights for the sampler-trainer mismatch.

The sampler (vLLM, or `rollout=hf` in bf16) and the trainer's own forward score the same
tokens a little differently. Every option takes (old_logp, sampler_logp, mask) -- pi_old, the
trainer's log-probs at rollout time [N, T] (no gradient), and the sampler's -- and returns
(weights [N, T] that multiply the per-token policy loss, no gradient, 0 on untrained tokens;
metrics: dict name -> float, the mismatch verl and TRL log).

    token level:     w_t = exp(old_logp_t - sampler_logp_t)
    sequence level:  w_t = exp(sum_t' (old_logp_t' - sampler_logp_t'))  on every token of the sequence
    truncate (TIS):  w <- clip(w, low, high)        (low None: no lower bound)
    mask:            w <- w * 1[low <= w <= high]   (low None: no lower bound)
    renormalize:     w <- w / mean(w)   (over trained tokens, or over sequences at sequence level)

Reference: verl `rollout_corr_helper.compute_rollout_correction_weights` (algorithm.
rollout_correction.rollout_is = token | sequence; rollout_is_threshold: a float = truncate at
it, "lower_upper" = IcePop mask; rollout_is_batch_normalize; log-ratios clamped to [-20, 20],
here too) and TRL `_generate_and_score_completions` (vllm_importance_sampling_correction,
default on; vllm_importance_sampling_mode token_truncate | token_mask | sequence_truncate |
sequence_mask, default sequence_mask; clip_max 3.0, clip_min None). The option names are
TRL's modes. Differences: verl truncates from above only (TRL clips to [min, max]: `low`);
verl's mask needs both bounds (TRL's `low` may be None); only verl renormalizes; TRL turns a
NaN sampler log-prob into ratio 1, and so does every trick here (tricks/behaviour.py). None of
them needs a gradient: verl detaches the weights, TRL computes them under no_grad. The fractions logged here are over
trained tokens at both levels (verl counts sequences at sequence level).
"""
from __future__ import annotations

import math

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.behaviour import known_or
from grpo_ablate.tricks.behaviour import log_ratio as behaviour_log_ratio
from grpo_ablate.tricks.conditions import same_sampler_and_trainer
from grpo_ablate.tricks.registry import (FLAG, POSITIVE, Activity, Claim, Inert, Allowed, Trick, choice, declare_family,
                                         register)

declare_family("rollout_correction", "importance weights π_old / π_sampler on the policy loss, with verl's mismatch "
               "metrics `rollout_corr/*`; AReaL's `decoupled` PPO and `m2po` mask; acts with stale rollouts "
               "(`staleness`), `rollout.dtype=bfloat16` or vLLM", stage="loss", metric="rollout_corr/is_mean")

LOG_RATIO_LIMIT = 20.0


@register("rollout_correction", "none")
def no_rollout_correction(old_logp, sampler_logp, mask):
    return torch.ones_like(old_logp), {}


def _masked_mean(values, mask) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def mismatch_metrics(old_logp, sampler_logp, mask) -> dict:
    """verl's off-policy diagnostics (compute_offpolicy_metrics) and TRL's sampling_logp_difference."""
    log_ratio = behaviour_log_ratio(old_logp, sampler_logp) * mask   # log(pi_old / pi_sampler)
    token_ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    seq_log_ratio = log_ratio.sum(dim=-1).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    gap = log_ratio.abs()
    return {
        "rollout_corr/kl": _masked_mean(-log_ratio, mask).item(),                       # E[log mu - log pi]
        "rollout_corr/k3_kl": _masked_mean(token_ratio - log_ratio - 1.0, mask).item(),
        "rollout_corr/chi2_token": (_masked_mean(token_ratio ** 2, mask) - 1.0).item(),
        "rollout_corr/chi2_seq": (torch.exp(2.0 * seq_log_ratio).mean() - 1.0).item(),
        "rollout_corr/logp_diff_mean": _masked_mean(gap, mask).item(),
        "rollout_corr/logp_diff_max": (gap * mask).max().item() if mask.numel() else 0.0,
    }


def _raw_weights(old_logp, sampler_logp, mask, level: str) -> torch.Tensor:
    log_ratio = behaviour_log_ratio(old_logp, sampler_logp) * mask
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(old_logp)
    return torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)) * mask


def _renormalized(weights, mask, level: str):
    """weights / their mean (verl rollout_is_batch_normalize); the factor, 1 when the mean is ~0."""
    if level == "token":
        mean = _masked_mean(weights, mask)
    else:   # one weight per (non-empty) sequence
        live = (mask.sum(dim=-1) > 0).to(weights.dtype)
        per_sequence = (weights * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
        mean = (per_sequence * live).sum() / live.sum().clamp(min=1)
    return (weights / mean, mean.item()) if mean > 1e-8 else (weights, 1.0)


def _importance_weights(old_logp, sampler_logp, mask, *, level: str, rule: str, low, high, renormalize):
    with torch.no_grad():
        mask = mask.to(old_logp.dtype)
        raw = _raw_weights(old_logp, sampler_logp, mask, level)
        lower = -float("inf") if low is None else float(low)
        outside = ((raw < lower) | (raw > high)) & (mask > 0)
        weights = raw.clamp(min=low, max=high) if rule == "truncate" else raw * (~outside).to(raw.dtype)
        weights = weights * mask
        trained = weights[mask > 0]
        metrics = {"rollout_corr/is_mean": _masked_mean(weights, mask).item(),
                   "rollout_corr/is_max": trained.max().item() if trained.numel() else 0.0,
                   "rollout_corr/is_min": trained.min().item() if trained.numel() else 0.0,
                   "rollout_corr/is_fraction_high": _masked_mean((raw > high).to(raw.dtype), mask).item(),
                   "rollout_corr/is_fraction_low": _masked_mean((raw < lower).to(raw.dtype), mask).item(),
                   f"rollout_corr/{'truncated' if rule == 'truncate' else 'masked'}_frac":
                       _masked_mean(outside.to(raw.dtype), mask).item()}
        if renormalize:
            weights, factor = _renormalized(weights, mask, level)
            metrics["rollout_corr/batch_norm_factor"] = factor
        metrics.update(mismatch_metrics(old_logp, sampler_logp, mask))
        return weights, metrics


def _option(level: str, rule: str, default_high: float, default_low):
    def importance_weights(old_logp, sampler_logp, mask, *, high: float = default_high,
                           low: float | None = default_low, renormalize: bool = False):
        return _importance_weights(old_logp, sampler_logp, mask, level=level, rule=rule, low=low, high=high,
                                   renormalize=renormalize)
    importance_weights.__name__ = importance_weights.__qualname__ = f"{level}_{rule}_weights"
    importance_weights.__doc__ = (f"{level}-level weights, {rule}d outside [low, high]; "
                                  f"defaults high={default_high}, low={default_low} (see the module docstring).")
    return importance_weights


# Defaults: verl's TIS threshold 2.0 for the truncations; TRL's default mode and bound (3.0, no
# lower bound) for sequence_mask; verl's IcePop example bounds 0.5_5.0 for token_mask.
KNOBS = {"high": POSITIVE, "low": Allowed(low=0, low_open=True, high="rollout_correction.high", optional=True),
         "renormalize": FLAG}
SAMPLER_IS_TRAINER = Inert(same_sampler_and_trainer, "cannot act when the sampler is the trainer itself (same model, "
                           "same dtype, no staleness, any kept set replayed): pi_old / pi_sampler ≡ 1",
                           "sample with staleness=fixed or rollout.dtype=bfloat16 (or rollout=vllm on a GPU)",
                           "a sampler that differs from the trainer (stale rollouts, bf16, vLLM, top-p unreplayed)")
NAMED = {   # the named trick of each option
    "token_truncate": Trick("rollout_token_truncate",
                            what="per-token importance weights pi_old / pi_sampler, truncated at 2 (TIS)",
                            source="verl rollout_correction rollout_is=token; TRL "
                                   "vllm_importance_sampling_mode=token_truncate",
                            verdict="not_in_review", cost="a pi_old forward per step"),
    "token_mask": Trick("rollout_token_mask", what="per-token importance weights, 0 outside [0.5, 5] (IcePop)",
                        source="verl rollout_is_threshold=lower_upper; TRL token_mask",
                        verdict="not_in_review", cost="a pi_old forward per step"),
    "sequence_truncate": Trick("rollout_sequence_truncate",
                               what="per-sequence importance weight (product of token ratios), truncated at 2",
                               source="verl rollout_is=sequence; TRL sequence_truncate",
                               verdict="not_in_review", cost="a pi_old forward per step"),
    "sequence_mask": Trick("rollout_sequence_mask",
                           what="per-sequence importance weight, sequences above 3 masked out",
                           source="TRL vllm_importance_sampling_mode=sequence_mask (its default)",
                           verdict="not_in_review", cost="a pi_old forward per step"),
    # AReaL's decoupled PPO (areal/utils/functional/functional.py `ppo_actor_loss_fn` with
    # `apply_rejection_sampling`, as examples/math/gsm8k_grpo.yaml sets it: use_decoupled_loss, level
    # token, action mask, metric ratio, upper 5): the loss (pi_prox / mu) PPOclip(pi_theta / pi_prox),
    # tokens whose weight exceeds 5 masked out. The ratio against pi_prox is the trainer's (pi_old).
    # Difference: AReaL keeps the unmasked token count as the denominator, and so does loss_agg here.
    "decoupled": Trick("decoupled_ppo",
                       what="AReaL's decoupled PPO: the loss weighted by pi_prox / mu, tokens above 5 masked",
                       source="AReaL actor.use_decoupled_loss + rejection_sampling (mask, ratio, upper 5)",
                       verdict="not_in_review", cost="a pi_old (proximal) forward per step",
                       claims=(Claim("helps", "", "AReaL (arXiv 2505.24298)",
                                     "keeps accuracy under staleness 4-8 where plain PPO degrades"),)),
}
for _name, _level, _rule, _high, _low in (("token_truncate", "token", "truncate", 2.0, None),
                                          ("token_mask", "token", "mask", 5.0, 0.5),
                                          ("sequence_truncate", "sequence", "truncate", 2.0, None),
                                          ("sequence_mask", "sequence", "mask", 3.0, None),
                                          ("decoupled", "token", "mask", 5.0, None)):
    register("rollout_correction", _name, needs_sampler_logprobs=True, knobs=KNOBS,
             activity=Activity("rollout_corr/logp_diff_mean"),   # the weights differ from 1
             inert=SAMPLER_IS_TRAINER, tricks=NAMED[_name])(_option(_level, _rule, _high, _low))


def _m2po_keep(m2: torch.Tensor, threshold: float) -> torch.Tensor:
    """Keep [n] bool: drop the largest second moments until the mean of the rest is below threshold
    (at least one kept). AReaL `_get_m2po_loss_mask`: sort descending, the first suffix whose mean
    is < threshold is kept."""
    order = torch.argsort(m2, descending=True, stable=True)
    ordered = m2[order]
    counts = torch.arange(len(m2), 0, -1, dtype=m2.dtype, device=m2.device)
    suffix_means = ordered.flip(0).cumsum(0).flip(0) / counts
    below = (suffix_means < threshold).nonzero()
    dropped = int(below[0]) if len(below) else len(m2) - 1
    keep = torch.ones_like(m2, dtype=torch.bool)
    keep[order[:dropped]] = False
    return keep


@register("rollout_correction", "m2po", needs_sampler_logprobs=True,
          knobs={"threshold": POSITIVE, "denominator": choice("kept", "trained")},
          activity=Activity("rollout_corr/masked_frac"), inert=SAMPLER_IS_TRAINER,
          tricks=Trick("m2po", what="M2PO: mask the tokens of largest (log pi_prox - log mu)^2 until their mean "
                       "second moment is below 0.04",
                       source="AReaL actor.m2_threshold (areal/trainer/ppo/actor.py _apply_m2po_masking; "
                              "arXiv 2510.01161)",
                       verdict="not_in_review", cost="a pi_old (proximal) forward per step",
                       claims=(Claim("helps", "", "M2PO (arXiv 2510.01161)",
                                     "stable training on data 256 updates stale, matching on-policy accuracy"),)))
def m2po_weights(old_logp, sampler_logp, mask, *, threshold: float = 0.04, denominator: str = "kept"):
    """M2PO (Zheng et al. 2025, arXiv 2510.01161; AReaL `_apply_m2po_masking`, docs m2po.md):

        M2_t = (log mu_t - log pi_prox_t)^2 over the batch's trained tokens
        sort descending; mask the largest until mean(M2 of the rest) < threshold (keep >= 1 token)

    Weights are the 0/1 mask (the paper's objective: sum M_t rho_t A_t over the masked tokens,
    the ratio against pi_prox). Differences: AReaL masks per micro-batch of its loss call and, in
    its example config, also multiplies the decoupled weights pi_prox / mu; here the mask is taken
    once over the whole batch (as rollout_correction's weights are, verl's convention) and alone
    (rollout_correction=decoupled is the other).

    The denominator (issue 35). AReaL's code replaces `loss_mask` by the M2PO mask before
    `ppo_actor_loss_fn`, which divides by the count of the mask it receives: the policy loss is
    the mean over the KEPT tokens (`denominator=kept`, the default). AReaL's docs (m2po.md) and
    the paper write 1 / sum_i |o_i|, every trained token (`denominator=trained`, this project's
    rule before issue 35); the gradient is then N_kept / N smaller. `kept` scales the 0/1 mask by
    N_trained / N_kept, so under loss_agg=token_mean (AReaL's aggregation) the loss is exactly the
    kept tokens' mean; other aggregations are scaled by the same batch-wide factor. Hand case:
    M2 = (1, .01, .01, .01), threshold .04, per-token losses (1, 2, 3, 4): kept 3.0, trained 2.25."""
    with torch.no_grad():
        trained = mask > 0
        m2 = behaviour_log_ratio(old_logp, sampler_logp).pow(2)
        keep = torch.zeros_like(trained)
        if trained.any():
            keep[trained] = _m2po_keep(m2[trained], float(threshold))
        kept = keep.to(old_logp.dtype)
        mask_f = mask.to(old_logp.dtype)
        scale = (mask_f.sum().clamp(min=1) / kept.sum().clamp(min=1)) if denominator == "kept" else 1.0
        weights = kept * scale
        metrics = {"rollout_corr/masked_frac": _masked_mean((trained & ~keep).to(old_logp.dtype), mask_f).item(),
                   "rollout_corr/m2": _masked_mean(m2, mask_f).item(),
                   "rollout_corr/m2_kept": _masked_mean(m2, kept).item(),
                   "rollout_corr/is_mean": _masked_mean(weights, mask_f).item()}
        metrics.update(mismatch_metrics(old_logp, sampler_logp, mask_f))
        return weights, metrics


# ------------------------------------------------------------------ rejection: one option, many spellings
def _token_divergence(log_ratio, old_logp, sampler_logp, metric: str) -> torch.Tensor:
    """The per-token statistic of `metric`, lr = log pi_old - log mu (0 where mu is unknown), r = e^lr."""
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    if metric == "ratio":
        return ratio
    if metric == "k1":
        return log_ratio
    if metric == "k2":
        return 0.5 * log_ratio ** 2
    if metric == "k3":          # r - 1 - log r (verl's k3; AReaL's help text)
        return ratio - 1.0 - log_ratio
    if metric == "k3_areal":    # 1/r - 1 + log r (AReaL's KLEstimator k3 on (log pi_prox, log mu))
        return torch.exp((-log_ratio).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)) - 1.0 + log_ratio
    return torch.exp(old_logp) - torch.exp(known_or(sampler_logp, old_logp))     # prob_diff (ROLL)


def _in_bounds(stat, low, high) -> torch.Tensor:
    inside = stat <= high
    return inside if low is None else inside & (stat >= low)


def _sequence_keep(stat, log_ratio, mask, *, metric, aggregation, low, high) -> torch.Tensor:
    """[N, 1] bool: the sequence's aggregate within bounds. The ratio aggregates in log space (AReaL:
    sum = the product of ratios, mean = their geometric mean, max = the largest); the others
    arithmetically; `all`: every trained token within bounds on its own."""
    trained = mask > 0
    if aggregation == "all":
        return (_in_bounds(stat, low, high) | ~trained).all(dim=-1, keepdim=True)
    values = log_ratio if metric == "ratio" else stat
    if aggregation == "max":
        per_sequence = values.masked_fill(~trained, -float("inf")).max(dim=-1, keepdim=True).values
        per_sequence = torch.where(trained.any(dim=-1, keepdim=True), per_sequence, torch.zeros_like(per_sequence))
    else:
        per_sequence = (values * mask).sum(dim=-1, keepdim=True)
        if aggregation == "mean":
            per_sequence = per_sequence / mask.sum(dim=-1, keepdim=True).clamp(min=1)
    if metric == "ratio":
        per_sequence = torch.exp(per_sequence.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    return _in_bounds(per_sequence, low, high)


def _criterion_keep(stat, log_ratio, mask, *, metric, level, aggregation, low, high) -> torch.Tensor:
    """One criterion's kept tokens ([N, T]) or sequences ([N, 1])."""
    if level == "token":
        return _in_bounds(stat, low, high)
    return _sequence_keep(stat, log_ratio, mask, metric=metric, aggregation=aggregation, low=low, high=high)


def _rejection_weights(log_ratio, mask, keep, *, metric, level, action, weighted, low, high) -> torch.Tensor:
    """The weights before the denominator: the importance weight (or 1), 0 where rejected (mask) or
    clamped to [low or 0, high] where out of bounds (clamp, AReaL)."""
    weight = torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    if level == "sequence" and metric == "ratio":     # AReaL: the geometric mean is every token's weight
        mean_log = (log_ratio * mask).sum(dim=-1, keepdim=True) / mask.sum(dim=-1, keepdim=True).clamp(min=1)
        weight = torch.exp(mean_log.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)).expand_as(log_ratio)
    if not weighted:
        weight = torch.ones_like(weight)
    if action == "clamp":
        clamped = weight.clamp(min=0.0 if low is None else low, max=high)
        return torch.where(keep, weight, clamped) * mask
    return weight * keep.to(weight.dtype) * mask


# verl's rollout_rs criteria, each as this option's settings: (metric, level, aggregation). A k1
# criterion bounds -lr = log mu/pi_old in [log l, log u], i.e. the ratio r in [1/u, 1/l]; the
# others bound k2 / k3 above by u.
VERL_CRITERIA = {f"token_{k}": ("ratio" if k == "k1" else k, "token", "mean") for k in ("k1", "k2", "k3")}
VERL_CRITERIA.update({f"seq_{agg}_{k}": ("ratio" if k == "k1" else k, "sequence", agg)
                      for agg in ("sum", "mean") for k in ("k1", "k2", "k3")})
VERL_CRITERIA.update({f"seq_max_{k}": (k, "sequence", "max") for k in ("k2", "k3")})


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _criteria_problem(criteria, thresholds) -> str | None:
    """Why a `criteria` / `thresholds` pair is not verl's chained rollout_rs, or None."""
    if not isinstance(criteria, (list, tuple)) or not all(c in VERL_CRITERIA for c in criteria):
        return (f"rollout_correction.criteria={criteria!r} is not allowed; allowed: a list of verl rollout_rs "
                f"criteria ({', '.join(VERL_CRITERIA)})")
    if not isinstance(thresholds, (list, tuple)) or len(thresholds) != len(criteria):
        return (f"rollout_correction.thresholds={thresholds!r} is not allowed; allowed: a list of one threshold per "
                f"criterion ({len(criteria)}), e.g. [0.01] (k1: [lower, upper])")
    for name, bound in zip(criteria, thresholds):
        if name.endswith("k1"):
            if not (isinstance(bound, (list, tuple)) and len(bound) == 2 and all(map(_number, bound))
                    and bound[0] <= bound[1]):
                return (f"rollout_correction.thresholds: {name} takes [lower, upper], two positive numbers with "
                        f"lower <= upper (verl's \"l_u\"); given {bound!r}")
        elif not _number(bound):
            return f"rollout_correction.thresholds: {name} takes one positive number (its upper bound); given {bound!r}"
    return None


def _check_rejection(cfg):
    rc = cfg.rollout_correction
    if rc.name != "rejection":
        return None
    if rc.action == "clamp" and not rc.weighted:
        return ("rollout_correction.action=clamp clamps the importance weight, but rollout_correction.weighted=false "
                "has none; set weighted=true or action=mask")
    criteria, thresholds = list(rc.get("criteria") or []), rc.get("thresholds") or []
    if criteria or thresholds:
        plain = ([b if isinstance(b, str) or not hasattr(b, "__iter__") else list(b) for b in thresholds]
                 if hasattr(thresholds, "__iter__") and not isinstance(thresholds, str) else thresholds)
        problem = _criteria_problem(criteria, plain)     # (a config's lists are not Python lists)
        if problem:
            return problem
        if rc.action == "clamp":
            return "rollout_correction.criteria (verl's chained rollout_rs) masks; use action=mask"
        return None
    floor = NEVER_BELOW.get(rc.metric)
    if floor is not None and float(rc.high) <= floor:   # nothing inside [low, high]: every token rejected
        return (f"rollout_correction.high={rc.high} would reject every token: metric={rc.metric} is never below "
                f"{floor:g}; give a high > {floor:g}")
    return None


# The least value each statistic takes (k1 = log r has none): a high at or below it rejects everything.
NEVER_BELOW = {"ratio": 0.0, "k2": 0.0, "k3": 0.0, "k3_areal": 0.0, "prob_diff": -1.0}


def _verl_keep(stat_of, log_ratio, mask, criteria, thresholds) -> torch.Tensor:
    """[N, T] bool: every listed criterion passes (verl ANDs them), each as this option's settings."""
    keep = torch.ones_like(mask, dtype=torch.bool)
    for name, bound in zip(criteria, thresholds):
        metric, level, aggregation = VERL_CRITERIA[name]
        if name.endswith("k1"):
            low, high = 1.0 / float(bound[1]), 1.0 / float(bound[0])
        else:
            low, high = None, float(bound)
        one = _criterion_keep(stat_of(metric), log_ratio, mask, metric=metric, level=level, aggregation=aggregation,
                              low=low, high=high)
        keep = keep & one.expand_as(keep)
    return keep


REJECTION_KNOBS = {"metric": choice("ratio", "k1", "k2", "k3", "k3_areal", "prob_diff"),
                   "level": choice("token", "sequence"), "aggregation": choice("sum", "mean", "max", "all"),
                   "action": choice("mask", "clamp"), "weighted": FLAG, "denominator": choice("trained", "kept"),
                   "high": Allowed(), "low": Allowed(high="rollout_correction.high", optional=True),
                   "criteria": Allowed("texts"), "thresholds": Allowed("any")}
TRUST_REGION_MASK = Trick(
    "trust_region_mask", what="mask every sequence whose mean k3 divergence r - 1 - log r from the sampler exceeds "
    "0.01 (Trust Region Masking)",
    source="verl rollout_correction rollout_rs=seq_mean_k3 (RolloutCorrectionConfig.decoupled_k3_rs; arXiv "
           "2512.23075); AReaL rejection_sampling; SkyRL/ROLL/OpenRLHF masks as knobs",
    verdict="not_in_review", cost="a pi_old forward per step",
    claims=(Claim("helps", "", "Trust Region Masking (arXiv 2512.23075)",
                  "masking sequences outside the trust region keeps long-horizon off-policy training stable"),))


@register("rollout_correction", "rejection", needs_sampler_logprobs=True, knobs=REJECTION_KNOBS,
          activity=Activity("rollout_corr/rejected_frac"), inert=SAMPLER_IS_TRAINER, checks=_check_rejection,
          tricks=TRUST_REGION_MASK)
def rejection_weights(old_logp, sampler_logp, mask, *, metric: str = "k3", level: str = "sequence",
                      aggregation: str = "mean", action: str = "mask", weighted: bool = False,
                      denominator: str = "trained", high: float = 0.01, low: float | None = None,
                      criteria: tuple = (), thresholds: tuple = ()):
    """Rejection sampling on a divergence of pi_old from the sampler mu; lr = log pi_old - log mu, r = e^lr:

        metric     ratio r | k1 lr | k2 lr^2/2 | k3 r - 1 - lr | k3_areal 1/r - 1 + lr | prob_diff pi_old - mu
        level      token: each token's statistic in [low, high];  sequence: the row's aggregate
        aggregation  sum | mean | max over the trained tokens (ratio: in log space, so sum = prod r,
                   mean = the geometric mean) | all: every token in bounds on its own
        action     mask: weight 0 outside; clamp: the importance weight clamped to [low or 0, high] there
        weighted   the weight kept is the importance ratio r (sequence level with metric ratio: the
                   geometric mean, every token) instead of 1
        denominator  trained: the loss's aggregation keeps the rejected tokens (AReaL); kept: the
                   weights scaled by N_trained / N_kept (verl and ROLL write the mask into response_mask)

    References (each a setting here; read at the commits named in tests/test_rejection.py):
    AReaL `apply_rejection_sampling` (RejectionSamplingConfig level, action, metric ratio|kl_k1|kl_k2|kl_k3,
    agg; its help text calls k3 r - log r - 1, its code computes 1/r - 1 + log r: k3_areal; the decoupled
    option is its example config); verl `compute_rollout_rejection_mask` (rollout_rs token_k*|seq_sum_k*|
    seq_mean_k*|seq_max_k*: metric k2/k3 with that level and aggregation, high = the threshold; verl's k1
    is -lr compared in log space with "l_u", i.e. metric=ratio low=1/u high=1/l; the defaults here are its
    decoupled_k3_rs preset, Trust Region Masking); SkyRL off_policy_correction (geometric / product
    sequence masks: metric ratio, aggregation mean / sum; outlier_token_is_threshold_low/high 1e-4/100:
    level sequence, aggregation all); ROLL train_infer_correction (filters on ratio or prob_diff,
    agg_type token | geometric = mean | sequence = sum); OpenRLHF is_correction_type tis | icepop |
    seq-mask-tis are token_truncate, token_mask and sequence_mask.

        criteria   verl's chained rollout_rs (its comma-separated list, e.g. [token_k1, seq_max_k3]):
                   when given, a token is kept where every listed criterion passes, and they replace
                   metric / level / aggregation / low / high; `thresholds` one per criterion as verl's
                   rollout_rs_threshold, [l, u] for a k1 criterion (verl's "l_u"), else the upper bound
                   (so [[0.5, 2.0], 3.0] is verl's "0.5_2.0,3.0"); action mask only
    Not here: ROLL's `segment` level (a multi-turn row's segments; every row here is one turn, whose
    one segment is the sequence)."""
    with torch.no_grad():
        mask_f = mask.to(old_logp.dtype)
        log_ratio = behaviour_log_ratio(old_logp, sampler_logp) * mask_f
        stat = _token_divergence(log_ratio, old_logp, sampler_logp, metric)
        if criteria:
            keep = _verl_keep(lambda m: _token_divergence(log_ratio, old_logp, sampler_logp, m), log_ratio, mask_f,
                              list(criteria), list(thresholds))
            metric, level = "k3", "token"      # weighted=true: each token's own importance ratio
        else:
            keep = _criterion_keep(stat, log_ratio, mask_f, metric=metric, level=level, aggregation=aggregation,
                                   low=low, high=high)
        keep = keep.expand_as(mask_f) | (mask_f == 0)
        weights = _rejection_weights(log_ratio, mask_f, keep, metric=metric, level=level, action=action,
                                     weighted=weighted, low=low, high=high)
        rejected = _masked_mean((~keep).to(mask_f.dtype), mask_f)
        if action == "mask" and denominator == "kept":     # verl and ROLL write the mask into response_mask
            weights = weights * (mask_f.sum().clamp(min=1) / (keep.to(mask_f.dtype) * mask_f).sum().clamp(min=1))
        metrics = {"rollout_corr/rejected_frac": rejected.item(),
                   "rollout_corr/is_mean": _masked_mean(weights, mask_f).item(),
                   "rollout_corr/divergence_mean": _masked_mean(stat, mask_f).item()}
        metrics.update(mismatch_metrics(old_logp, sampler_logp, mask_f))
        return weights, metrics
