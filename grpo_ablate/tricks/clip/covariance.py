"""Family `clip`, the covariance masks (arXiv 2505.22617): the tokens whose advantage and log-probability
covary most lose their gradient at random (`clip_cov`) or get a |log ratio| penalty (`kl_cov`).
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.clip.ratio import EPS, clip_fractions, importance_ratio
from grpo_ablate.tricks.conditions import ONE_STEP, one_forward_statistic
from grpo_ablate.tricks.registry import NON_NEGATIVE, NUMBER, Activity, Allowed, Trick, register


def covariance(advantages, logp, mask) -> torch.Tensor:
    """Per-token (A_t - mean A)(log pi_t - mean log pi), means over the batch's trained tokens."""
    with torch.no_grad():
        advantages = advantages.expand_as(logp)
        n = mask.sum().clamp(min=1)
        return ((advantages - (advantages * mask).sum() / n)
                * (logp.detach() - (logp.detach() * mask).sum() / n))


@register("clip", "clip_cov",
          what="Clip-Cov (The Entropy Mechanism of RL for Reasoning LMs, arXiv 2505.22617): PPO clip, and a random "
               "`ratio` of the tokens with cov_low < cov(A, log pi) < cov_high get no gradient (verl "
               "loss_mode=clip_cov)",
          notes={"ratio": "verl policy_loss.clip_cov_ratio",
                 "cov_low": "verl clip_cov_lb",
                 "cov_high": "verl clip_cov_ub"},
          knobs={**EPS, "ratio": Allowed(low=0, high=1, low_open=True), "cov_low": NUMBER, "cov_high": NUMBER},
          checks=(lambda cfg: None if cfg.clip.cov_low < cfg.clip.cov_high else (
              f"clip.cov_low={cfg.clip.cov_low} and clip.cov_high={cfg.clip.cov_high} leave an empty band; "
              "cov_low must be < cov_high"),
              one_forward_statistic("clip=clip_cov's covariance and its draw of tokens")),
          activity=Activity("clip_cov/frac"),
          writes=("clip/high_frac", "clip_cov/frac"),
          tricks=(Trick("clip_cov",
                        what="Clip-Cov: a random few high-covariance tokens lose their gradient",
                        source="verl loss_mode=clip_cov (arXiv 2505.22617)",
                        verdict="not_in_review"),))
def clip_cov_loss(logp, old_logp, advantages, mask, *, eps_low: float = 0.2, eps_high: float = 0.2,
                  ratio: float = 2e-4, cov_low: float = 1.0, cov_high: float = 5.0,
                  generator: torch.Generator | None = None):
    """Clip-Cov ("The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617): PPO clip,
    and a random few of the tokens with a large covariance lose their gradient.

        cov_t = (A_t - mean A)(log pi_t - mean log pi)   (over the batch's trained tokens)
        candidates: trained tokens with cov_low < cov_t < cov_high that PPO clip did not clip
        chosen: max(int(ratio * n_tokens), 1) of them, uniformly at random (all if fewer)
        loss_t = max(-rho A, -clip(rho) A) * (0 if chosen else 1)

    Reference: verl core_algos `compute_policy_loss_clip_cov` (policy_loss.clip_cov_ratio
    2e-4, clip_cov_lb 1.0, clip_cov_ub 5.0; no log-ratio clamp there, [-20, 20] here; its
    draw is torch.randperm on the global RNG, here on `generator`, which the trainer supplies
    seeded and checkpointed). Acts on-policy too (not off_policy_only). `clip_cov/frac` is
    the fraction of tokens chosen (verl's pg_clipfrac).
    """
    mask = mask.to(logp.dtype)
    rho = importance_ratio(logp, old_logp)
    unclipped, clipped = -advantages * rho, -advantages * rho.clamp(1.0 - eps_low, 1.0 + eps_high)
    with torch.no_grad():
        cov = covariance(advantages, logp, mask)
        candidate = (cov > cov_low) & (cov < cov_high) & (mask > 0) & ~(clipped > unclipped)
        where = candidate.flatten().nonzero().squeeze(1)
        count = max(int(ratio * mask.sum().item()), 1)
        device = generator.device if generator is not None else "cpu"
        order = torch.randperm(len(where), generator=generator, device=device).to(where.device)
        keep = torch.ones(logp.numel(), dtype=logp.dtype, device=logp.device)
        keep[where[order[:count]]] = 0.0
        keep = keep.view_as(logp)
    loss = torch.maximum(unclipped, clipped) * keep
    stats = clip_fractions(rho, advantages, 1.0 - eps_low, 1.0 + eps_high, loss)
    stats["clip_cov/frac"] = (1.0 - keep) * mask
    return loss, stats


@register("clip", "kl_cov",
          what="KL-Cov (arXiv 2505.22617): no clip; the top `ratio` of tokens by cov(A, log pi) get kl_coef |log pi -"
               " log pi_old| added (verl loss_mode=kl_cov)",
          notes={"ratio": "verl policy_loss.kl_cov_ratio", "kl_coef": "verl policy_loss.ppo_kl_coef"},
          off_policy_only=True,
          knobs={"ratio": Allowed(low=0, high=1, low_open=True), "kl_coef": NON_NEGATIVE},
          checks=one_forward_statistic("clip=kl_cov's covariance and its top tokens"),
          inert=ONE_STEP,
          activity=Activity("kl_cov/penalty"),
          writes=("kl_cov/frac",),
          tricks=(Trick("kl_cov",
                        what="KL-Cov: the top covariance tokens get a |log ratio| penalty, no clip",
                        source="verl loss_mode=kl_cov (arXiv 2505.22617)",
                        verdict="not_in_review"),))
def kl_cov_loss(logp, old_logp, advantages, mask, *, ratio: float = 2e-4, kl_coef: float = 0.1):
    """KL-Cov (arXiv 2505.22617): no clip; the tokens with the largest covariance get a KL penalty.

        cov_t as in clip_cov; chosen: the top max(1, int(ratio * n_tokens)) trained tokens by cov
        loss_t = -rho_t A_t + (kl_coef |Delta_t| if chosen else 0)

    Reference: verl core_algos `compute_policy_loss_kl_cov` (policy_loss.kl_cov_ratio 2e-4,
    ppo_kl_coef 0.1; no log-ratio clamp there, [-20, 20] here). On-policy Delta = 0 and
    d|x|/dx = 0 at 0, so the gradient is plain PPO's: off_policy_only. `kl_cov/frac` is the
    fraction chosen, `kl_cov/penalty` the penalty they carry (0 on-policy).
    """
    mask = mask.to(logp.dtype)
    log_ratio = logp - old_logp
    loss = -advantages * importance_ratio(logp, old_logp)
    with torch.no_grad():
        cov = covariance(advantages, logp, mask).masked_fill(mask == 0, float("-inf"))
        valid = int(mask.sum().item())
        count = min(max(1, int(valid * ratio)), valid)
        chosen = torch.zeros(logp.numel(), dtype=logp.dtype, device=logp.device)
        chosen[torch.topk(cov.flatten(), count).indices] = 1.0
        chosen = chosen.view_as(logp)
    penalty = kl_coef * log_ratio.abs() * chosen
    loss = loss + penalty
    return loss, {"kl_cov/frac": chosen * mask, "kl_cov/penalty": penalty.detach()}
