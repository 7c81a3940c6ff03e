"""Family `clip`, the losses with one importance ratio per sequence (flag `sequence_ratio`): GSPO's
geometric-mean ratio clipped per sequence, GMPO's geometric mean of per-token clipped log-ratios
(one loss value per sequence, flag `per_sequence_loss`), LUSPO's length-scaled GSPO.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.clip.ratio import EPS, RATIO_MOVES, clip_fractions, float_like
from grpo_ablate.tricks.conditions import ONE_STEP, one_forward_statistic
from grpo_ablate.tricks.registry import Activity, Trick, choice, register

GSPO_LOG_RATIO_MAX = 10.0    # verl clamps the sequence log-ratio from above at 10 (GSPO)


@register("clip", "gspo",
          what="GSPO (arXiv 2507.18071): one ratio per sequence, s = exp(mean_t log(pi / pi_old)), clipped at the "
               "sequence level (verl loss_mode=gspo; TRL importance_sampling_level=sequence). Pair with "
               "loss_agg=seq_mean_token_mean, the paper's aggregation (preset=gspo does).",
          notes={"eps_low": "the paper's and verl's example (ratios per sequence move far less)"},
          off_policy_only=True, sequence_ratio=True,
          knobs=EPS,
          inert=ONE_STEP,
          activity=RATIO_MOVES,
          tricks=(Trick("gspo",
                        what="GSPO: one ratio per sequence (geometric mean), clipped per sequence",
                        source="verl loss_mode=gspo; TRL importance_sampling_level=sequence (arXiv 2507.18071)",
                        verdict="not_in_review"),))
def gspo_loss(logp, old_logp, advantages, mask, *, eps_low: float = 3e-4, eps_high: float = 4e-4):
    """GSPO (arXiv 2507.18071): one importance ratio per sequence, clipped at the sequence level.

        s_i = exp(mean_t Delta_t)   (mean over the sequence's trained tokens)
        s_it = sg(s_i) pi_t / sg(pi_t)   (value s_i, gradient s_i grad log pi_t)
        loss_t = max(-A s_it, -A clip(s_it, 1 - eps_low, 1 + eps_high))

    Reference: verl core_algos `compute_policy_loss_gspo` (loss_mode=gspo, this per-token
    form; log s_it clamped <= 10); TRL `_compute_loss` with importance_sampling_level=
    "sequence" (a [B, 1] ratio, no clamp). Under loss_agg=seq_mean_token_mean (the paper's
    and TRL's `grpo` aggregation) both give mean_i max(-A_i s_i, -A_i clip(s_i)) with the
    gradient -(A_i s_i / |o_i|) sum_t grad log pi_t of each unclipped sequence; under
    token_mean (verl's default mode) verl's per-token form weights sequences by length.
    Defaults eps 3e-4 / 4e-4: the paper's and verl's example (examples/gspo_trainer).
    """
    mask = mask.to(logp.dtype)
    lengths = mask.sum(dim=-1, keepdim=True).clamp(min=1)
    seq_log_ratio = ((logp - old_logp) * mask).sum(dim=-1, keepdim=True) / lengths
    log_s = (logp - logp.detach() + seq_log_ratio.detach()).clamp(max=GSPO_LOG_RATIO_MAX)
    s = torch.exp(log_s)
    loss = torch.maximum(-advantages * s, -advantages * s.clamp(1.0 - eps_low, 1.0 + eps_high))
    return loss, clip_fractions(s, advantages, 1.0 - eps_low, 1.0 + eps_high, loss)


@register("clip", "gmpo",
          what="GMPO (arXiv 2507.20673): geometric mean of the token ratios, each clipped in log space to [-eps_low, "
               "eps_high] (verl loss_mode=geo_mean); aggregates as seq_mean_token_mean",
          notes={"eps_low": "verl's examples/gmpo_trainer",
                 "mean_over": "verl: the mean over all B rows (a fully masked row counts 0) | live: over non-empty "
                              "rows",
                 "is_weights": "token-level rollout IS weights per sequence, exp(mean log w) (verl) | token: each "
                               "its own"},
          off_policy_only=True, per_sequence_loss=True, sequence_ratio=True,
          knobs={**EPS, "mean_over": choice("all", "live")}, inert=ONE_STEP, activity=RATIO_MOVES,
          checks=one_forward_statistic("clip=gmpo's mean_over=all (the share of live rows)",
                                       unless=lambda cfg: cfg.clip.mean_over == "live"),
          tricks=(Trick("gmpo",
                        what="GMPO: geometric mean of the token ratios, clipped per token in log space",
                        source="verl loss_mode=geo_mean (arXiv 2507.20673)",
                        verdict="not_in_review"),))
def gmpo_loss(logp, old_logp, advantages, mask, *, eps_low: float = 0.4, eps_high: float = 0.4,
              mean_over: str = "all"):
    """GMPO (arXiv 2507.20673): the geometric mean of token ratios, clipped per token in log space.

        Delta'_t = sgn(A) min(sgn(A) Delta_t, sgn(A) clip(Delta_t, -eps_low, eps_high))
        rho_i = exp(mean_t Delta'_t),  A_i = mean_t A_t
        loss = (1/B) sum_i (-A_i rho_i)

    Reference: verl core_algos `compute_policy_loss_geo_mean` (loss_mode=geo_mean; torch.mean
    over all B sequences of the micro-batch, ignoring loss_agg_mode; no log-ratio clamp;
    defaults 0.4 from verl's examples/gmpo_trainer). Every token of sequence i carries the
    value -A_i rho_i (B_live / B): under loss_agg=seq_mean_token_mean, which averages over the
    B_live sequences with a trained token, that is verl's mean over all B, fully masked rows
    (the overlong filter makes them) counting as 0 (`mean_over=all`, verl's convention;
    `mean_over=live` averages over the non-empty rows only, the B / B_live larger loss). B is
    the rows this call sees (a mini-batch, or this rank's share of it, as verl's micro-batch).
    Token-level rollout importance weights (rollout_correction token_*) enter as their
    per-sequence geometric mean exp(mean_t log w_t), as in verl (flag per_sequence_loss; the
    trainer's setting clip.is_weights=token multiplies each token's loss by its own weight
    instead: sequence_is_weights below). Under any mode the gradient at rho = 1 is plain
    PPO-clip's. A clipped token has zero gradient; a token counts as clipped (clip/low_frac,
    clip/high_frac) when the clamp is the active branch.
    """
    mask = mask.to(logp.dtype)
    log_ratio = logp - old_logp
    sign = torch.sign(advantages)
    clamped = log_ratio.clamp(-eps_low, eps_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    lengths = mask.sum(dim=-1, keepdim=True)
    rho = torch.exp((pessimistic * mask).sum(dim=-1, keepdim=True) / (lengths + 1e-8))
    seq_advantage = (advantages * mask).sum(dim=-1, keepdim=True) / (lengths + 1e-8)
    loss = (-seq_advantage * rho).expand_as(logp)
    if mean_over == "all" and mask.shape[0]:
        live = (lengths > 0).sum().clamp(min=1).to(loss.dtype)
        loss = loss * (live / mask.shape[0])
    with torch.no_grad():
        stats = {"clip/low_frac": float_like((log_ratio < -eps_low) & (advantages < 0), loss),
                 "clip/high_frac": float_like((log_ratio > eps_high) & (advantages > 0), loss)}
    return loss, stats


def sequence_is_weights(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-level importance weights [N, T] as one weight per sequence [N, 1], their geometric
    mean over its trained tokens: exp(sum_t m_t log(w_t + 1e-10) / (sum_t m_t + 1e-8)) (verl
    compute_policy_loss_geo_mean's seq_is_weights; a weight a mask rule set to 0 pulls its
    sequence's weight to ~0)."""
    mask = mask.to(weights.dtype)
    return torch.exp((torch.log(weights + 1e-10) * mask).sum(dim=-1, keepdim=True)
                     / (mask.sum(dim=-1, keepdim=True) + 1e-8))


@register("clip", "luspo",
          what="LUSPO (TRL loss_type=luspo): GSPO's sequence-ratio loss scaled by the sequence's length",
          notes={"eps_low": "the paper's (TRL paper index: epsilon=2e-3)", "eps_high": "(epsilon_high=2.5e-3)"},
          sequence_ratio=True,   # the length scaling acts on-policy too: not off_policy_only
          knobs=EPS,
          activity=Activity("luspo/length_scale", "above", 1.0),
          writes=("luspo/length_scale",),
          tricks=(Trick("luspo",
                        what="LUSPO: GSPO's sequence-ratio loss scaled by the sequence's length",
                        source="TRL loss_type=luspo (arXiv 2602.05261)",
                        verdict="not_in_review"),))
def luspo_loss(logp, old_logp, advantages, mask, *, eps_low: float = 2e-3, eps_high: float = 2.5e-3):
    """LUSPO (arXiv 2602.05261): GSPO with each sequence's loss multiplied by its length, which
    removes GSPO's bias against long responses.

        loss_t = n_i * gspo_loss_t     (n_i the sequence's trained tokens)

    Reference: TRL `_compute_loss`, loss_type="luspo" with importance_sampling_level="sequence":
    per-sequence -min(s_i A_i, clip(s_i) A_i), times mask.sum(1), mean over the sequences.
    Under loss_agg=seq_mean_token_mean (TRL's `grpo` aggregation, the default here) this per-token
    form gives exactly that: (1/B) sum_i (1/n_i) sum_t n_i l_i = mean_i n_i l_i. Defaults: the
    paper's epsilons (TRL paper index, section 5.1). The ratio and its gradient are gspo_loss's,
    which with rho == 1 differ from PPO's by the factor n_i: LUSPO acts on-policy too.
    `luspo/length_scale`: n_i on each token.
    """
    loss, stats = gspo_loss(logp, old_logp, advantages, mask, eps_low=eps_low, eps_high=eps_high)
    lengths = mask.sum(dim=-1, keepdim=True)
    stats["luspo/length_scale"] = lengths.expand_as(loss).detach()
    return loss * lengths, stats
