"""Family `rollout_correction`, the rejection masks: one option (`rejection`) for the masks of AReaL,
verl, SkyRL, ROLL and OpenRLHF on a divergence of pi_old from the sampler mu. Split from
weights.py (the importance weights) by kind; it shares that module's conventions
(the data arguments, the log-ratio clamp, verl's mismatch metrics) and its inert rule.
"""
from __future__ import annotations

import math

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.behaviour import known_or
from grpo_ablate.tricks.behaviour import log_ratio as behaviour_log_ratio
from grpo_ablate.tricks.registry import FLAG, Allowed, Claim, Activity, Trick, choice, register
from grpo_ablate.tricks.rollout_correction.weights import (LOG_RATIO_LIMIT, SAMPLER_IS_TRAINER, masked_mean,
                                                         mismatch_metrics)


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
    if metric == "binary_kl":
        return bernoulli_kl_both_ways(old_logp, known_or(sampler_logp, old_logp))
    return torch.exp(old_logp) - torch.exp(known_or(sampler_logp, old_logp))     # prob_diff (ROLL)


BERNOULLI_EPS = 1e-8    # AReaL compute_binary_kl_divergence's eps: p and q clamped to [eps, 1 - eps]


def bernoulli_kl_both_ways(old_logp, sampler_logp) -> torch.Tensor:
    """KPop's statistic: max(KL(P || Q), KL(Q || P)) for the Bernoulli distributions [p, 1 - p] and
    [q, 1 - q] of the sampled token's probability under pi_old (p) and the sampler (q),

        KL(P || Q) = p log(p / q) + (1 - p) log((1 - p) / (1 - q)),   p, q clamped to [1e-8, 1 - 1e-8]

    AReaL 13353cc67 (#1405) `compute_binary_kl_divergence`, called both ways in
    `apply_rejection_sampling` (metric binary_kl); the token is kept where the max is <= phi.
    Computed in float64: in float32 (AReaL's log-probs) 1 - 1e-8 rounds to 1, so a token whose
    probability rounds to 1 (log-prob 0, common for confident tokens) gives 0 * log 0 = NaN there,
    and AReaL masks it (NaN <= phi is false); here its KL is the finite value the clamp intends."""
    p = torch.exp(old_logp.double()).clamp(BERNOULLI_EPS, 1.0 - BERNOULLI_EPS)
    q = torch.exp(sampler_logp.double()).clamp(BERNOULLI_EPS, 1.0 - BERNOULLI_EPS)

    def kl(a, b):
        return a * torch.log(a / b) + (1.0 - a) * torch.log((1.0 - a) / (1.0 - b))
    return torch.maximum(kl(p, q), kl(q, p)).to(old_logp.dtype)


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
NEVER_BELOW = {"ratio": 0.0, "k2": 0.0, "k3": 0.0, "k3_areal": 0.0, "prob_diff": -1.0, "binary_kl": 0.0}


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


REJECTION_KNOBS = {"metric": choice("ratio", "k1", "k2", "k3", "k3_areal", "prob_diff", "binary_kl"),
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


# KPop as AReaL's example config (examples/math/gsm8k_kpop.yaml at 13353cc67) sets it: use_decoupled_loss
# (the ratio pi_prox / mu multiplies the loss: weighted), rejection_sampling level token, action mask,
# metric binary_kl, upper 2.0; the rejected tokens stay in the denominator (ppo_actor_loss_fn counts
# the loss mask before rejection): denominator trained, this option's default. AReaL's docs
# (algorithms/grpo_series.md) say KPop takes action mask only and ignores `lower`; its code takes
# both (clamp clamps the importance weight to [lower or 0, upper]; a lower bounds the KL from
# below): the code is followed, so both are allowed here too.
KPOP = Trick(
    "kpop", what="KPop: mask tokens whose Bernoulli KL between pi_old's and the sampler's token probability, the "
    "larger of both directions, exceeds 2.0; the rest weighted by pi_old / mu (decoupled loss)",
    source="AReaL 13353cc67 (#1405) rejection_sampling.metric=binary_kl (areal/utils/functional/functional.py "
           "compute_binary_kl_divergence)",
    verdict="not_in_review", cost="a pi_old (proximal) forward per step",
    settings={"metric": "binary_kl", "level": "token", "weighted": True, "high": 2.0})


@register("rollout_correction", "rejection",
          what="Rejection sampling on the sampler-trainer divergence (AReaL rejection_sampling, verl rollout_rs, "
               "SkyRL/ROLL masks); the defaults are verl's decoupled_k3_rs (Trust Region Masking)",
          notes={"metric": "ratio | k1 | k2 | k3 | k3_areal | prob_diff | binary_kl (KPop)",
                 "level": "token | sequence",
                 "aggregation": "sum | mean | max | all (sequence level)",
                 "action": "mask | clamp (clamp needs weighted: true)",
                 "weighted": "multiply the importance ratio (AReaL) rather than 1 (verl rollout_rs)",
                 "denominator": "trained: rejected tokens stay in the loss's denominator (AReaL); kept: verl, ROLL",
                 "criteria": "verl's chained rollout_rs, e.g. [token_k1,seq_max_k3]: replaces metric..high",
                 "thresholds": "one per criterion: [l,u] for a k1 criterion, else the upper bound"},
          needs_sampler_logprobs=True, needs_old_forward=True, knobs=REJECTION_KNOBS,
          weighs_by_ratio=lambda values: bool(values["weighted"]),   # weighted: the kept tokens carry pi_old / mu
          activity=Activity("rollout_corr/rejected_frac"), inert=SAMPLER_IS_TRAINER, checks=_check_rejection,
          tricks=(TRUST_REGION_MASK, KPOP))
def rejection_weights(old_logp, sampler_logp, mask, *, metric: str = "k3", level: str = "sequence",
                      aggregation: str = "mean", action: str = "mask", weighted: bool = False,
                      denominator: str = "trained", high: float = 0.01, low: float | None = None,
                      criteria: tuple = (), thresholds: tuple = ()):
    """Rejection sampling on a divergence of pi_old from the sampler mu; lr = log pi_old - log mu, r = e^lr:

        metric     ratio r | k1 lr | k2 lr^2/2 | k3 r - 1 - lr | k3_areal 1/r - 1 + lr | prob_diff pi_old - mu
                   | binary_kl max(KL(P||Q), KL(Q||P)) of the Bernoulli token probabilities (KPop)
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
    KPop (AReaL 13353cc67) is metric=binary_kl with the named trick `kpop`'s settings: see KPOP.
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
        rejected = masked_mean((~keep).to(mask_f.dtype), mask_f)
        if action == "mask" and denominator == "kept":     # verl and ROLL write the mask into response_mask
            weights = weights * (mask_f.sum().clamp(min=1) / (keep.to(mask_f.dtype) * mask_f).sum().clamp(min=1))
        metrics = {"rollout_corr/rejected_frac": rejected.item(),
                   "rollout_corr/is_mean": masked_mean(weights, mask_f).item(),
                   "rollout_corr/divergence_mean": masked_mean(stat, mask_f).item()}
        metrics.update(mismatch_metrics(old_logp, sampler_logp, mask_f))
        return weights, metrics
