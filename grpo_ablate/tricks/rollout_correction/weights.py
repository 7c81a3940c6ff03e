"""Family `rollout_correction`, the importance weights for the sampler-trainer mismatch.

The sampler (vLLM, or `rollout=hf` in bf16) and the trainer's own forward score the same
tokens a little differently. Every option takes (old_logp, sampler_logp, mask) -- pi_old, the
trainer's log-probs at rollout time [N, T] (no gradient), and the sampler's -- and returns
(weights [N, T] that multiply the per-token policy loss, no gradient, 0 on untrained tokens;
metrics: dict name -> float, the mismatch verl and TRL log). An option with the `reads_advantages`
flag also takes the loss's advantages as the keyword `advantages` (supplied by the trainer, which
then computes its weights after the advantage chain: tv_filter.py); the others are computed before
it, where an estimator may read them (OTB).

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


from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.behaviour import log_ratio as behaviour_log_ratio
from grpo_ablate.tricks.conditions import same_sampler_and_trainer
from grpo_ablate.tricks.registry import (FLAG, POSITIVE, Activity, Claim, Inert, Allowed, Trick, choice, register)

LOG_RATIO_LIMIT = 20.0


@register("rollout_correction", "none",
          what="no importance weights for the sampler-trainer mismatch (the loss trusts the sampled tokens as is)")
def no_rollout_correction(old_logp, sampler_logp, mask):
    return torch.ones_like(old_logp), {}


def masked_mean(values, mask) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def mismatch_metrics(old_logp, sampler_logp, mask) -> dict:
    """verl's off-policy diagnostics (compute_offpolicy_metrics) and TRL's sampling_logp_difference."""
    log_ratio = behaviour_log_ratio(old_logp, sampler_logp) * mask   # log(pi_old / pi_sampler)
    token_ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    seq_log_ratio = log_ratio.sum(dim=-1).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    gap = log_ratio.abs()
    return {
        "rollout_corr/kl": masked_mean(-log_ratio, mask).item(),                       # E[log mu - log pi]
        "rollout_corr/k3_kl": masked_mean(token_ratio - log_ratio - 1.0, mask).item(),
        "rollout_corr/chi2_token": (masked_mean(token_ratio ** 2, mask) - 1.0).item(),
        "rollout_corr/chi2_seq": (torch.exp(2.0 * seq_log_ratio).mean() - 1.0).item(),
        "rollout_corr/logp_diff_mean": masked_mean(gap, mask).item(),
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
        mean = masked_mean(weights, mask)
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
        metrics = {"rollout_corr/is_mean": masked_mean(weights, mask).item(),
                   "rollout_corr/is_max": trained.max().item() if trained.numel() else 0.0,
                   "rollout_corr/is_min": trained.min().item() if trained.numel() else 0.0,
                   "rollout_corr/is_fraction_high": masked_mean((raw > high).to(raw.dtype), mask).item(),
                   "rollout_corr/is_fraction_low": masked_mean((raw < lower).to(raw.dtype), mask).item(),
                   f"rollout_corr/{'truncated' if rule == 'truncate' else 'masked'}_frac":
                       masked_mean(outside.to(raw.dtype), mask).item()}
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
WHAT = {   # each option's line (the header of its conf file)
    "token_truncate": "truncated importance sampling (TIS), per token: w = min(pi_old / pi_sampler, high) (verl "
                      "rollout_is=token, rollout_is_threshold=2.0; TRL vllm_importance_sampling_mode=token_truncate)",
    "token_mask": "masked importance sampling per token (IcePop): w = pi_old / pi_sampler, 0 outside [low, high] "
                  "(verl rollout_is=token with rollout_is_threshold=\"0.5_5.0\"; "
                  "TRL vllm_importance_sampling_mode=token_mask)",
    "sequence_truncate": "truncated importance sampling per sequence: w = min(prod_t pi_old / pi_sampler, high) on "
                         "all its tokens (verl rollout_is=sequence, its default level, threshold 2.0; "
                         "TRL sequence_truncate)",
    "sequence_mask": "masked importance sampling per sequence: a sequence whose ratio prod_t pi_old / pi_sampler lies "
                     "outside [low, high] gets weight 0, the others keep their ratio (TRL's default mode: "
                     "sequence_mask, clip_max 3.0)",
    "decoupled": "AReaL's decoupled PPO (use_decoupled_loss, rejection_sampling mask/ratio/upper 5): the loss weighted "
                 "by pi_prox / mu per token, tokens whose weight exceeds `high` masked out",
}
NOTES = {   # beside a knob in its conf file
    "token_truncate": {"high": "verl's default threshold", "low": "TRL clip_min: a lower bound too (verl has none)",
                       "renormalize": "verl rollout_is_batch_normalize: weights divided by their batch mean"},
    "token_mask": {"low": "null: no lower bound (TRL's clip_min default)"},
    "decoupled": {"high": "AReaL rejection_sampling.upper", "low": "AReaL rejection_sampling.lower (none)"},
}
for _name, _level, _rule, _high, _low in (("token_truncate", "token", "truncate", 2.0, None),
                                          ("token_mask", "token", "mask", 5.0, 0.5),
                                          ("sequence_truncate", "sequence", "truncate", 2.0, None),
                                          ("sequence_mask", "sequence", "mask", 3.0, None),
                                          ("decoupled", "token", "mask", 5.0, None)):
    # weighs_each_token: each token's weight is a function of its own ratio alone (score_centering
    # applies the same rule to the sampler's head ids)
    register("rollout_correction", _name, needs_sampler_logprobs=True, needs_old_forward=True,
             weighs_by_ratio=True, weighs_each_token=_level == "token",
             knobs=KNOBS,   # the weights are pi_old / mu, truncated or masked
             activity=Activity("rollout_corr/logp_diff_mean"),   # the weights differ from 1
             inert=SAMPLER_IS_TRAINER, tricks=NAMED[_name], what=WHAT[_name],
             notes=NOTES.get(_name, {}))(_option(_level, _rule, _high, _low))


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


@register("rollout_correction", "m2po",
          what="M2PO (AReaL actor.m2_threshold): mask the tokens of largest (log pi_prox - log mu)^2 until the mean "
               "second moment of the rest is below the threshold",
          notes={"threshold": "AReaL examples/math/gsm8k_m2po.yaml",
                 "denominator": "the policy loss's mean over the kept tokens (AReaL's code); trained: its docs' "
                                "1/sum|o_i|"},
          needs_sampler_logprobs=True, needs_old_forward=True,
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

    The denominator. AReaL's code replaces `loss_mask` by the M2PO mask before
    `ppo_actor_loss_fn`, which divides by the count of the mask it receives: the policy loss is
    the mean over the KEPT tokens (`denominator=kept`, the default). AReaL's docs (m2po.md) and
    the paper write 1 / sum_i |o_i|, every trained token (`denominator=trained`, this project's
    former rule); the gradient is then N_kept / N smaller. `kept` scales the 0/1 mask by
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
        metrics = {"rollout_corr/masked_frac": masked_mean((trained & ~keep).to(old_logp.dtype), mask_f).item(),
                   "rollout_corr/m2": masked_mean(m2, mask_f).item(),
                   "rollout_corr/m2_kept": masked_mean(m2, kept).item(),
                   "rollout_corr/is_mean": masked_mean(weights, mask_f).item()}
        metrics.update(mismatch_metrics(old_logp, sampler_logp, mask_f))
        return weights, metrics
