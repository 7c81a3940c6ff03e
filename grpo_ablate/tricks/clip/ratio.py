"""Family `clip`, the per-token ratio losses: PPO clip (`symmetric`; `higher`, DAPO clip-higher), SAPO's
soft gate and DPPO's trust region on the probability; and what every kind of the family shares: the
clamped ratio, the clip indicators, the knob ranges (the family's conventions: tricks/clip/__init__.py).

PPO clip (`symmetric`, `higher`):
    loss_t = -min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)
`symmetric`: eps_low = eps_high = 0.2. `higher` (DAPO clip-higher) raises eps_high to 0.28.
Reference: verl core_algos `compute_policy_loss_vanilla` (clip_ratio_low / clip_ratio_high);
TRL `_compute_loss` (epsilon_low / epsilon_high). log rho is clamped to [-20, 20] before exp.
With one update per rollout rho == 1, nothing clips and the fractions are 0: expected. The
family `dual_clip` (tricks/dual_clip.py) caps this loss for A < 0.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.conditions import ONE_STEP
from grpo_ablate.tricks.registry import (DAPO, NON_NEGATIVE, POSITIVE, TRICKS_OR_TRAPS, Activity, Claim, Trick, choice,
                                         register)

EPS = {"eps_low": POSITIVE, "eps_high": POSITIVE}
RATIO_MOVES = Activity("ppo/kl")   # equal to PPO-clip's gradient while rho == 1: the ratio must move

LOG_RATIO_LIMIT = 20.0


def importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    return torch.exp((logp - old_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))


def float_like(flags: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Boolean per-token indicators as floats of the loss's shape (for token-averaged metrics)."""
    return flags.to(like.dtype).expand_as(like).detach()


def clip_fractions(ratio, advantages, low: float, high: float, like) -> dict:
    """A token is clipped when the clamp is the active branch of the pessimistic min."""
    with torch.no_grad():
        return {"clip/low_frac": float_like((ratio < low) & (advantages < 0), like),
                "clip/high_frac": float_like((ratio > high) & (advantages > 0), like)}


@register("clip", "symmetric",
          what="PPO ratio clip, 1 - eps_low .. 1 + eps_high",
          off_policy_only=True,
          knobs=EPS,
          inert=ONE_STEP)
@register("clip", "higher",
          what="DAPO clip-higher: a wider upper bound keeps low-probability tokens growing",
          defaults={"eps_high": 0.28},
          off_policy_only=True,
          knobs=EPS,
          inert=ONE_STEP,
          activity=Activity("ppo/ratio_max", "above", 1.2),
          tricks=(Trick("clip_higher",
                        what="DAPO clip-higher, eps_high 0.28",
                        source="verl clip_ratio_high; TRL epsilon_high",
                        verdict="not_applicable",
                        claims=(
                            Claim("helps", "model=aligned", TRICKS_OR_TRAPS,
                                  "raising the upper clip bound (0.2 -> 0.28) helps aligned models explore (less "
                                  "entropy collapse)"),
                            Claim("does not help", "model=base", TRICKS_OR_TRAPS,
                                  "on base models raising the upper clip bound does little or harms"),
                            Claim("helps", "model=base", DAPO,
                                  "clip-higher keeps the entropy from collapsing: one of DAPO's four techniques "
                                  "(Qwen2.5-32B base)"),)),))
def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
                  eps_low: float = 0.2, eps_high: float = 0.2, dual_clip_c: float | None = None):
    """Per-token clipped policy loss and per-token clip indicators (floats, for metrics).

    `advantages` broadcasts against logp ([B, 1] per sequence or [B, T] per token).
    """
    ratio = importance_ratio(logp, old_logp)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    stats = clip_fractions(ratio, advantages, 1.0 - eps_low, 1.0 + eps_high, loss)
    stats["clip/dual_frac"] = torch.zeros_like(stats["clip/low_frac"])
    if dual_clip_c is not None:
        capped = torch.minimum(loss, -dual_clip_c * advantages)   # max(obj, c A) as a loss
        negative = advantages < 0
        with torch.no_grad():
            stats["clip/dual_frac"] = (negative & (capped < loss)).to(logp.dtype)
        loss = torch.where(negative, capped, loss)
    return loss, stats


@register("clip", "sapo",
          what="SAPO (arXiv 2511.20347): soft gate sigmoid(tau (rho - 1)) 4 / tau instead of the hard clip (verl "
               "loss_mode=sapo; TRL loss_type=sapo); both aggregate it like seq_mean_token_mean",
          notes={"tau_pos": "tau for A > 0 (verl tau_pos; TRL sapo_temperature_pos)", "tau_neg": "tau for A <= 0"},
          off_policy_only=True,
          knobs={"tau_pos": POSITIVE, "tau_neg": POSITIVE},
          inert=ONE_STEP,
          activity=Activity("sapo/grad_weight_dev"),
          writes=("sapo/grad_weight_dev",),
          tricks=(Trick("sapo",
                        what="SAPO: soft sigmoid gate on the ratio instead of the hard clip",
                        source="verl loss_mode=sapo; TRL loss_type=sapo (arXiv 2511.20347)",
                        verdict="not_in_review"),))
def sapo_loss(logp, old_logp, advantages, mask, *, tau_pos: float = 1.0, tau_neg: float = 1.05):
    """SAPO (arXiv 2511.20347): a soft gate instead of the hard clip.

        f(rho) = sigmoid(tau (rho - 1)) 4 / tau,  tau = tau_pos if A > 0 else tau_neg
        loss_t = -f(rho_t) A_t
        gradient: -4 sigmoid'(tau (rho - 1)) rho A grad log pi  (= -A grad log pi at rho = 1)

    Reference: verl core_algos `compute_policy_loss_sapo` (actor tau_pos 1.0, tau_neg 1.05;
    verl forces seq-mean-token-mean aggregation); TRL `_compute_loss`, loss_type="sapo"
    (sapo_temperature_pos / _neg, aggregated like `grpo`): use loss_agg=seq_mean_token_mean
    to reproduce either. log rho clamped to [-20, 20] as in verl. `sapo/grad_weight_dev` is
    |4 sigmoid' rho - 1|, how far the gate moved a token's gradient from the plain one.
    """
    ratio = importance_ratio(logp, old_logp)
    tau = torch.where(advantages > 0, advantages.new_tensor(tau_pos), advantages.new_tensor(tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -(gate * 4.0 / tau) * advantages
    with torch.no_grad():
        grad_weight = 4.0 * gate * (1.0 - gate) * ratio
        stats = {"sapo/grad_weight_dev": (grad_weight - 1.0).abs().expand_as(loss).to(logp.dtype)}
    return loss, stats


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
