"""Family `clip`, the async-era policy losses of 2026 (the family and its conventions: clip.py;
the penalised and windowed REINFORCE ones: clip_reinforce.py): dppo, vespo, luspo, topr, kimi15, clamped_reinforce.
Each function's docstring gives its formula and the source it follows.
"""
from __future__ import annotations

import math

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.conditions import ONE_STEP
from grpo_ablate.tricks.registry import (NON_NEGATIVE, POSITIVE, Activity, Trick, choice, register)
from grpo_ablate.tricks.clip import EPS, LOG_RATIO_LIMIT, RATIO_MOVES, float_like, gspo_loss, importance_ratio


@register("clip", "dppo",
          what="DPPO (SkyRL policy_loss_type=dppo; prime-rl's default loss): the unclipped ratio, tokens whose "
               "probability moved more than delta in the advantage's direction masked",
          notes={"divergence": "binary_tv: |pi - mu| in A's direction | symmetric_tv: either way (prime-rl IPO) | "
                               "binary_kl",
                 "delta_low": "SkyRL dppo.delta_low, prime-rl dppo_mask_low",
                 "delta_high": "SkyRL dppo.delta_high, prime-rl dppo_mask_high",
                 "kl_tau": "prime-rl kl_tau (log pi/mu)^2 term (its default 1e-3: +trick=prime_rl_loss); SkyRL: none"},
          off_policy_only=True,
          knobs={"divergence": choice("binary_tv", "binary_kl", "symmetric_tv"), "delta_low": POSITIVE,
                 "delta_high": POSITIVE,
                 "kl_tau": NON_NEGATIVE},
          inert=ONE_STEP,
          activity=RATIO_MOVES,
          tricks=(Trick("dppo",
                        what="DPPO: mask tokens by the probability change |pi - mu| (binary TV), not the ratio",
                        source="SkyRL policy_loss_type=dppo (skyrl_train/utils/ppo_utils.py); prime-rl default loss "
                               "(arXiv 2602.04879)",
                        verdict="not_in_review"),
                  Trick("prime_rl_loss",
                        what="prime-rl's default loss: DPPO binary-TV mask + kl_tau (log pi/mu)^2, tau 1e-3",
                        source="prime-rl DefaultLossConfig (src/prime_rl/trainer/rl/loss.py default_loss_fn); Kimi "
                               "K2.5 KL (arXiv 2602.02276)",
                        verdict="not_in_review", settings={"kl_tau": 1.0e-3}),
                  Trick("ipo_loss",
                        what="prime-rl's IPO loss: tokens whose probability moved more than 0.1 either way masked "
                             "whatever the advantage's sign, + kl_tau (log pi/mu)^2, tau 1e-3",
                        source="prime-rl IPOLossConfig (src/prime_rl/trainer/rl/loss.py ipo_loss_fn)",
                        verdict="not_in_review",   # IPOLossConfig's ipo_threshold and kl_tau
                        settings={"divergence": "symmetric_tv", "delta_low": 0.1, "delta_high": 0.1,
                                  "kl_tau": 1.0e-3})))
def dppo_loss(logp, old_logp, advantages, mask, *, divergence: str = "binary_tv", delta_low: float = 0.2,
              delta_high: float = 0.2, kl_tau: float = 0.0):
    """DPPO (arXiv 2602.04879): the unclipped ratio, with tokens whose probability moved too far
    in the advantage's direction masked -- a trust region on the probability, not the ratio.

        rho_t = exp(logp_t - old_logp_t),  d_t = pi_t - mu_t  (probabilities, mu = exp(old_logp))
        binary_tv: keep_t = not (A > 0 and d_t > delta_high) and not (A < 0 and -d_t > delta_low)
        symmetric_tv: keep_t = not (d_t > delta_high or -d_t > delta_low), whatever A's sign
                   (prime-rl `ipo_loss_fn`: |pi - mu| > ipo_threshold 0.1; the named trick `ipo_loss`)
        binary_kl: D_t = mu log(mu / pi) + (1 - mu) log((1 - mu + 1e-8) / (1 - pi + 1e-8));
                   keep_t = not (A > 0 and d_t > 0 and D_t > delta_high) and not (A < 0 and d_t < 0 and D_t > delta_low)
        loss_t = -keep_t rho_t A_t + kl_tau (logp_t - old_logp_t)^2

    References: SkyRL `dppo_policy_loss` (policy_loss_type=dppo, dppo.dppo_type binary_tv |
    binary_kl, delta_low = delta_high = 0.2; log rho clamped at 20; mu = the rollout's log-probs
    when there are any, else old_log_probs) and prime-rl `default_loss_fn` (binary TV with
    dppo_mask_low/high 0.2, plus kl_tau (log pi/mu)^2 on every loss token, kl_tau 1e-3; the
    named trick `prime_rl_loss` sets it). Both normalize by the step's tokens (loss_agg=token_mean).
    Here mu is the loss's old_logp: pi_old, or the sampler's own log-probs with proximal=behaviour
    (SkyRL's and prime-rl's choice when the rollout records them). The kl_tau term is
    prime-rl's; SkyRL has none (kl_tau 0, the default here). `clip/high_frac`, `clip/low_frac`:
    the masked tokens with A > 0 and A < 0.
    """
    log_ratio = logp - old_logp
    ratio = importance_ratio(logp, old_logp)
    with torch.no_grad():
        pi, mu = torch.exp(logp), torch.exp(old_logp)
        moved = pi - mu
        if divergence in ("binary_tv", "symmetric_tv"):
            high, low = moved > delta_high, -moved > delta_low
        else:
            kl = mu * (old_logp - logp) + (1 - mu) * torch.log((1 - mu + 1e-8) / (1 - pi + 1e-8))
            high, low = (moved > 0) & (kl > delta_high), (moved < 0) & (kl > delta_low)
        symmetric = divergence == "symmetric_tv"      # IPO: the trust region does not look at A
        masked_high = high & (True if symmetric else advantages > 0)
        masked_low = low & (True if symmetric else advantages < 0)
        keep = (~(masked_high | masked_low)).to(logp.dtype)
    loss = -keep * ratio * advantages + kl_tau * log_ratio.pow(2)
    return loss, {"clip/high_frac": float_like(masked_high, loss), "clip/low_frac": float_like(masked_low, loss)}


@register("clip", "vespo",
          what="VESPO (TRL loss_type=vespo): -sg(phi(W)) A log pi, phi a Gamma kernel of the sequence ratio W",
          notes={"k_pos": "TRL vespo_k_pos",
                 "lambda_pos": "TRL vespo_lambda_pos",
                 "k_neg": "TRL vespo_k_neg",
                 "lambda_neg": "TRL vespo_lambda_neg"},
          off_policy_only=True,
          knobs={"k_pos": NON_NEGATIVE, "lambda_pos": POSITIVE, "k_neg": NON_NEGATIVE, "lambda_neg": POSITIVE},
          inert=ONE_STEP,
          activity=Activity("vespo/phi_dev"),
          writes=("vespo/phi_dev",),
          tricks=(Trick("vespo",
                        what="VESPO: -sg(phi(W)) A log pi, phi(W) = W^k e^(lambda (1 - W)) of the sequence ratio W",
                        source="TRL loss_type=vespo (grpo_trainer.py get_gamma_weights; arXiv 2602.10693)",
                        verdict="not_in_review"),))
def vespo_loss(logp, old_logp, advantages, mask, *, k_pos: float = 2.0, lambda_pos: float = 3.0, k_neg: float = 3.0,
               lambda_neg: float = 2.0):
    """VESPO (arXiv 2602.10693): a REINFORCE loss whose weight is a Gamma kernel of the
    sequence's importance ratio, phi(1) = 1, suppressing far-off sequences smoothly.

        log W_i = clamp(sum_t clamp(Delta_t, -20, 20), log 1e-8, 20)   (a sum, not a mean)
        phi_i = exp(lambda + k log W_i - lambda W_i)   (k, lambda by the sign of A: A >= 0 -> pos)
        loss_t = -sg(phi_i) A_i log pi_t

    Reference: TRL `GRPOTrainer.get_gamma_weights` and `_compute_loss` (loss_type="vespo";
    defaults k_pos 2, lambda_pos 3, k_neg 3, lambda_neg 2; lambda clamped >= 1e-4; NaN/inf phi
    -> 0), whose normalizer is the step's token count (loss_agg=token_mean). Difference: TRL
    folds its vLLM importance ratio pi_old / pi_sampler into W; here rollout_correction's
    weights multiply the loss afterwards. `vespo/phi_dev`: |phi - 1| per token (0 on-policy).
    """
    with torch.no_grad():
        delta = (logp - old_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        log_w = (delta * mask).sum(dim=-1, keepdim=True).clamp(math.log(1e-8), LOG_RATIO_LIMIT)
        positive = advantages >= 0
        k = torch.where(positive, torch.as_tensor(float(k_pos), dtype=logp.dtype),
                        torch.as_tensor(float(k_neg), dtype=logp.dtype))
        lam = torch.where(positive, torch.as_tensor(float(lambda_pos), dtype=logp.dtype),
                          torch.as_tensor(float(lambda_neg), dtype=logp.dtype)).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    loss = -phi * advantages * logp
    return loss, {"vespo/phi_dev": (phi - 1).abs().expand_as(loss)}


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


@register("clip", "topr",
          what="TOPR (ROLL pg_variant=topr): plain -A log pi on positive sequences, -sg(clip(rho, 0, 1)) A log pi on "
               "negative",
          off_policy_only=True,
          inert=ONE_STEP,
          activity=RATIO_MOVES,
          tricks=(Trick("topr",
                        what="TOPR: plain -A log pi on positive sequences, -sg(clip(rho, 0, 1)) A log pi on negative",
                        source="ROLL pg_variant=topr (roll/pipeline/rlvr/actor_pg_worker.py; arXiv 2503.14286)",
                        verdict="not_in_review"),))
def topr_loss(logp, old_logp, advantages, mask):
    """TOPR, tapered off-policy REINFORCE (arXiv 2503.14286, eq. 8): an SFT-like update on the
    positive sequences, truncated importance sampling in [0, 1] on the negative ones.

        loss_t = -A_t log pi_t                          (A > 0)
        loss_t = -sg(clamp(rho_t, 0, 1)) A_t log pi_t   (otherwise)

    Reference: ROLL `ActorPGWorker._compute_topr_loss` (pg_variant=topr, topr_positive_weight =
    topr_negative_weight = 1). Difference: ROLL splits by the reward (scores > 0); here by the
    advantage's sign, the only signal the policy loss gets -- the same split for binary rewards
    wherever A != 0 (and a token with A = 0 has no loss either way). `clip/high_frac`: negative
    tokens whose ratio was capped at 1.
    """
    ratio = importance_ratio(logp, old_logp)
    positive = advantages > 0
    weight = torch.where(positive, torch.ones_like(ratio), ratio.clamp(0.0, 1.0)).detach()
    loss = -weight * advantages * logp
    return loss, {"clip/high_frac": float_like(~positive & (ratio > 1.0), loss)}


@register("clip", "kimi15",
          what="Kimi k1.5 (ROLL pg_variant=kimi15): -A log pi + tau/2 (log pi - log pi_old)^2",
          notes={"tau": "ROLL kimi15_tau"},
          off_policy_only=True,
          knobs={"tau": NON_NEGATIVE},
          inert=ONE_STEP,
          activity=RATIO_MOVES,
          writes=("loss",),
          tricks=(Trick("kimi15",
                        what="Kimi k1.5 loss: -A log pi + tau/2 (log pi/pi_old)^2, tau 0.1",
                        source="ROLL pg_variant=kimi15 (roll/pipeline/rlvr/actor_pg_worker.py; arXiv 2501.12599)",
                        verdict="not_in_review"),))
def kimi15_loss(logp, old_logp, advantages, mask, *, tau: float = 0.1):
    """Kimi k1.5 (arXiv 2501.12599, eq. 3): REINFORCE with a squared log-ratio penalty to the
    policy that sampled.

        loss_t = -A_t log pi_t + tau / 2 (log pi_t - log pi_old_t)^2

    Reference: ROLL `ActorPGWorker._compute_kimi15_loss` (pg_variant=kimi15, kimi15_tau 0.1).
    """
    return -advantages * logp + 0.5 * tau * (logp - old_logp).pow(2), {}


@register("clip", "clamped_reinforce",
          what="PipelineRL policy_loss=reinforce: -sg(clamp(rho, 0, 1 + eps_high)) A log pi",
          notes={"eps_high": "PipelineRL epsilon_high"},
          off_policy_only=True,
          knobs={"eps_high": POSITIVE},
          inert=ONE_STEP,
          activity=RATIO_MOVES,
          tricks=(Trick("clamped_reinforce",
                        what="PipelineRL's REINFORCE: -sg(clamp(rho, 0, 1 + eps_high)) A log pi",
                        source="PipelineRL rl.policy_loss=reinforce (pipelinerl/finetune/rl/__init__.py rl_step)",
                        verdict="not_in_review"),))
def clamped_reinforce_loss(logp, old_logp, advantages, mask, *, eps_high: float = 0.2):
    """PipelineRL's REINFORCE (policy_loss=reinforce): the importance ratio, clamped to
    [0, 1 + eps_high], weighs a plain policy gradient and carries no gradient itself.

        loss_t = -sg(clamp(rho_t, 0, 1 + eps_high)) A_t log pi_t

    Reference: PipelineRL `rl_step` (case "reinforce"; epsilon_high 0.2; old log-probs from the
    inference engine: proximal=behaviour here). PipelineRL weighs tokens by 1 / batch_size (its
    sum over tokens: loss_agg=seq_mean_token_sum). `clip/high_frac`: tokens whose ratio was capped.
    """
    ratio = importance_ratio(logp, old_logp)
    loss = -ratio.clamp(0.0, 1.0 + eps_high).detach() * advantages * logp
    return loss, {"clip/high_frac": float_like(ratio.detach() > 1.0 + eps_high, loss)}
