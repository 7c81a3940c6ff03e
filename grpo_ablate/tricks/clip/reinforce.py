"""Family `clip`, the REINFORCE losses -w_t A_t log pi_t: the weight w carries no gradient (a clipped,
capped, windowed or kernel-shaped importance weight: CISPO, TOPR, VESPO, PipelineRL's clamped REINFORCE,
rollout IS), or there is none and a penalty holds pi near pi_old instead of a clip (GPG, Kimi k1.5, DRO).
Their values are not surrogate objectives: compare gradients, not loss values.
"""
from __future__ import annotations

import math

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.clip.ratio import EPS, LOG_RATIO_LIMIT, RATIO_MOVES, float_like, importance_ratio
from grpo_ablate.tricks.conditions import ONE_STEP, policy_never_leaves_sampler
from grpo_ablate.tricks.registry import (NON_NEGATIVE, POSITIVE, RGRA, SCALERL, Activity, Claim, Inert, Trick, option,
                                         register)


@register("clip", "cispo",
          what="CISPO, verl form (MiniMax-M1, arXiv 2506.13585): -sg(clip(rho, 1 - eps_low, 1 + eps_high)) A log pi; "
               "the weight is clipped, the gradient never cut (verl loss_mode=cispo)",
          notes={"eps_low": "verl's example: no lower bound in practice, as in MiniMax-M1"},
          off_policy_only=True,
          knobs=EPS,
          inert=ONE_STEP,
          activity=RATIO_MOVES,
          tricks=(Trick("cispo",
                        what="CISPO: -sg(clip(rho)) A log pi, the IS weight clipped, never the gradient",
                        source="verl loss_mode=cispo (MiniMax-M1, arXiv 2506.13585)",
                        verdict="not_in_review"),))
def cispo_loss(logp, old_logp, advantages, mask, *, eps_low: float = 10.0, eps_high: float = 0.2):
    """CISPO, verl form (MiniMax-M1, arXiv 2506.13585): a REINFORCE loss whose importance weight
    is clipped and carries no gradient, so no token ever loses its gradient.

        loss_t = -sg(clip(rho_t, 1 - eps_low, 1 + eps_high)) A_t log pi_t
        gradient: -clip(rho_t) A_t grad log pi_t

    Reference: verl core_algos `compute_policy_loss_cispo` (loss_mode=cispo; log rho clamped
    to [-20, 20]), aggregated by verl's loss_agg_mode (token-mean by default). Defaults:
    verl's example (examples/cispo_trainer: clip_ratio_low=10, i.e. no lower bound, as in
    MiniMax-M1; clip_ratio_high=0.2). `cispo_trl` is TRL's absolute cap. The loss's value
    is -w A log pi, not a surrogate objective: compare gradients, not loss values.
    """
    ratio = importance_ratio(logp, old_logp)
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high).detach()
    loss = -weight * advantages * logp
    with torch.no_grad():
        stats = {"clip/low_frac": float_like(ratio < 1.0 - eps_low, loss),
                 "clip/high_frac": float_like(ratio > 1.0 + eps_high, loss)}
    return loss, stats


@register("clip", "cispo_trl",
          what="CISPO, TRL form (loss_type=cispo, as ScaleRL): -sg(min(rho, eps_max)) A log pi, an absolute cap",
          notes={"eps_max": "TRL epsilon_high for cispo: ScaleRL's recommended 5.0"},
          off_policy_only=True,
          knobs={"eps_max": POSITIVE},
          inert=ONE_STEP,
          activity=RATIO_MOVES,
          tricks=(Trick("cispo_trl",
                        what="CISPO with an absolute cap: -sg(min(rho, 5)) A log pi",
                        source="TRL loss_type=cispo (ScaleRL, arXiv 2510.13786)",
                        verdict="not_in_review",
                        claims=(Claim("helps", "", SCALERL,
                                      "the loss type moves the asymptote: CISPO's ceiling is above a PPO-clipped "
                                      "loss's (DAPO's there)", measure="ceiling"),)),))
def cispo_trl_loss(logp, old_logp, advantages, mask, *, eps_max: float = 5.0):
    """CISPO, TRL form (ScaleRL, arXiv 2510.13786): the weight is capped absolutely, not around 1.

        loss_t = -sg(min(rho_t, eps_max)) A_t log pi_t

    Reference: TRL `_compute_loss`, loss_type="cispo" (`epsilon_high` is eps_max there; TRL
    recommends ScaleRL's 5.0), aggregated over the tokens of the whole step (TRL's cispo
    normalizer: loss_agg=token_mean). TRL does not clamp log rho; here it is clamped to
    [-20, 20] (exp(20) is far above any cap). `clip/high_frac` counts tokens whose weight was
    capped, whatever the sign of A (TRL's cispo_clip_ratio counts A > 0 only).
    """
    ratio = importance_ratio(logp, old_logp)
    loss = -ratio.clamp(max=eps_max).detach() * advantages * logp
    return loss, {"clip/high_frac": float_like(ratio.detach() > eps_max, loss)}


def _double_weight(cfg) -> str | None:
    """The sampler-anchored ratio is itself the correction for the sampler: a rollout_correction that
    weighs by pi_old / mu too counts the mismatch twice (SkyRL refuses TIS with cispo_anchor=rollout)."""
    correction = cfg.get("rollout_correction")
    if correction is None or correction.name == "none":
        return None
    weighs = option("rollout_correction", correction.name).weighs_by_ratio
    if not (weighs(correction) if callable(weighs) else weighs):
        return None
    return (f"clip={cfg.clip.name} weighs each token by pi / mu already, and rollout_correction={correction.name} "
            "multiplies pi_old / mu on top: the mismatch would count twice; use rollout_correction=none (or a mask: "
            "m2po, rejection with weighted=false)")


@register("clip", "cispo_rollout",
          what="CISPO anchored on the sampler (SkyRL cispo.cispo_anchor=rollout): -sg(clip(pi / mu, 1 - eps_low, "
               "1 + eps_high)) A log pi, mu the sampler's log-probs; SkyRL's bounds [0, 5]",
          notes={"eps_low": "SkyRL cispo_eps_clip_low: 1, a lower bound of 0 (none), ScaleRL's",
                 "eps_high": "SkyRL cispo_eps_clip_high: 4, an upper bound of 5, ScaleRL's"},
          off_policy_only=True,
          needs_sampler_logprobs=True,   # read in the loss: the ratio's denominator (train/losses.py)
          ratio_on_sampler=True,
          knobs=EPS,
          inert=Inert(policy_never_leaves_sampler, "cannot act with one optimizer step per rollout when the sampler "
                      "is the trainer itself (pi / mu ≡ 1)", "add staleness=fixed or updates.mini_batches=4",
                      "several optimizer steps per rollout or a sampler that differs from the trainer (stale "
                      "rollouts, bf16, vLLM)"),
          activity=Activity("cispo/ratio_dev"),   # ppo/kl is pi_old's: 0 at one step, where this one acts
          writes=("clip/high_frac", "cispo/ratio_dev"),
          checks=_double_weight,
          tricks=(Trick("cispo_rollout_anchor",
                        what="CISPO with its IS weight against the sampler's log-probs, clip(pi / mu, 0, 5): the "
                             "clamp acts under staleness and sampler mismatch even at one step per rollout",
                        source="SkyRL cispo.cispo_anchor=rollout (dda1cb3c8, #1859; bounds fdfcb4352, #1928)",
                        verdict="not_in_review"),))
def cispo_rollout_loss(logp, old_logp, advantages, mask, *, eps_low: float = 1.0, eps_high: float = 4.0):
    """CISPO with the importance ratio anchored on the behaviour policy mu (the sampler), not on
    pi_old (the trainer's recompute). The loss is clip=cispo's; the trainer hands it mu's log-probs
    as `old_logp` (the option's `ratio_on_sampler` flag; an unknown sampler log-prob is pi_old's):

        loss_t = -sg(clip(pi_t / mu_t, 1 - eps_low, 1 + eps_high)) A_t log pi_t

    Reference: SkyRL `compute_policy_loss_cispo` with cispo.cispo_anchor="rollout"
    (skyrl/backends/skyrl_train/utils/ppo_utils.py, commit dda1cb3c8f0823236d98026c78ce290372683ab1,
    PR #1859): behavior_log_probs = rollout_logprobs, log ratio clamped to [-20, 20]; the defaults are
    SkyRL's since fdfcb435235ce6564e43af5e83bd85bb1f6af032 (#1928), eps_low 1 and eps_high 4, ScaleRL's
    [0, 5]. Only the policy loss moves its anchor: the KL term, rollout_correction's statistics and
    the ratio metrics keep pi_old (the `proximal` family), as in SkyRL; `proximal=behaviour` moves
    them all. A rollout_correction that weighs by pi_old / mu is refused (SkyRL refuses TIS: the
    mismatch would count twice). With one optimizer step per rollout pi_old is pi_theta, so
    clip=cispo's ratio is 1 and its clamp never acts (SkyRL's reason for the anchor); this one's
    acts whenever mu differs from pi_theta (staleness, bf16 or vLLM sampling). Tinker's CISPO (its
    ratio is against the sampler; default {clip_low_threshold 0, clip_high_threshold 4}, tinker-cookbook
    eb2dc4ee) is this option with eps_high=3. `cispo/ratio_dev`: |pi / mu - 1| per token (SkyRL logs
    cispo/ratio_mean; 0 when the sampler is the trainer), the option's activity.
    """
    loss, stats = cispo_loss(logp, old_logp, advantages, mask, eps_low=eps_low, eps_high=eps_high)
    stats["cispo/ratio_dev"] = (importance_ratio(logp, old_logp).detach() - 1).abs()
    return loss, stats


@register("clip", "gpg",
          what="GPG (arXiv 2504.02546): plain REINFORCE, -A log pi, no ratio and no clip (verl loss_mode=gpg); its "
               "advantage is adv=gpg",
          off_policy_only=True,
          inert=ONE_STEP,
          activity=RATIO_MOVES,
          writes=("loss",),
          tricks=(Trick("gpg_loss",
                        what="GPG loss: plain -A log pi, no ratio, no clip (pair with gpg_advantage)",
                        source="verl loss_mode=gpg (arXiv 2504.02546)",
                        verdict="not_in_review",
                        claims=(Claim("does not hurt", "", RGRA,
                                      "REINFORCE with GRPO's group-relative advantage and KL term but no ratio and no "
                                      "clip (RGRA) matches or beats GRPO: PPO's clip is not needed"),)),))
def gpg_loss(logp, old_logp, advantages, mask):
    """GPG (Group Policy Gradient, arXiv 2504.02546): plain REINFORCE, no ratio and no clip.

        loss_t = -A_t log pi_t

    Reference: verl core_algos `compute_policy_loss_gpg` (loss_mode=gpg; with adv=gpg, the
    GPG advantage). Its gradient is PPO-clip's at rho = 1; off-policy it simply ignores the
    ratio, so it differs from PPO only with several optimizer steps per rollout.
    """
    return -advantages * logp, {}


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


@register("clip", "dro",
          what="DRO (verl policy_loss.loss_mode=dro): -(A log pi - beta/2 (log pi - log pi_old)^2), no clip",
          notes={"beta": "verl dro_beta (> 0)"},
          off_policy_only=True, knobs={"beta": POSITIVE}, inert=ONE_STEP, activity=RATIO_MOVES,
          tricks=(Trick("dro_loss",
                        what="DRO: REINFORCE with a quadratic proximal penalty beta/2 (log pi - log pi_old)^2 in "
                             "place of the clip",
                        source="verl policy_loss.loss_mode=dro, dro_beta (docs/algo/dro.md)",
                        verdict="not_in_review"),))
def dro_loss(logp, old_logp, advantages, mask, *, beta: float = 0.1):
    """DRO: a REINFORCE term with a quadratic proximal penalty in place of the clip,

        loss_t = -(A_t log pi_t - beta / 2 (log pi_t - log pi_old_t)^2)
        gradient wrt log pi_t: -A_t + beta (log pi_t - log pi_old_t)

    Reference: verl policy_loss.loss_mode=dro (docs/algo/dro.md, verl PR #7245, read at commit
    ea53291385ce764019a2b40733605f21d8317583). `beta` is verl's `dro_beta` (> 0; 0.1 as twinkle's
    DROLoss, which mirrors verl's, defaults it). On-policy (pi = pi_old) the penalty's gradient is 0
    and dro is plain REINFORCE, so it acts only once pi moves from pi_old (several optimizer steps
    per rollout, or a stale/mismatched pi_old).
    """
    log_ratio = logp - old_logp
    loss = -(advantages * logp - 0.5 * beta * log_ratio.pow(2))
    with torch.no_grad():
        moved = float_like(log_ratio.abs() > 0, loss)      # tokens the penalty pulls back (0 on-policy)
    return loss, {"clip/high_frac": moved * float_like(log_ratio > 0, loss), "clip/low_frac": moved * float_like(
        log_ratio < 0, loss)}


@register("clip", "rollout_is",
          what="SkyRL policy_loss_type=rollout_is (GLM-5): -sg(r) A log pi, r zeroed outside (1 - eps_low, 1 + "
               "eps_high); the rollout anchor is proximal=behaviour",
          notes={"eps_low": "SkyRL eps_clip_low", "eps_high": "SkyRL eps_clip_high"},
          off_policy_only=True, knobs={"eps_low": POSITIVE, "eps_high": POSITIVE},
          inert=ONE_STEP, activity=RATIO_MOVES,
          tricks=(Trick("rollout_is_loss",
                        what="GLM-5's calibrated IS policy gradient: -sg(r) A log pi, r zeroed outside (0.8, 1.2)",
                        source="SkyRL policy_loss_type=rollout_is (ppo_utils.py rollout_is_policy_loss); anchored on "
                               "the sampler with proximal=behaviour",
                        verdict="not_in_review"),))
def rollout_is_loss(logp, old_logp, advantages, mask, *, eps_low: float = 0.2, eps_high: float = 0.2):
    """GLM-5's calibrated importance-sampled policy gradient:

        r_t = exp(log pi_t - log mu_t),  f(r) = r on (1 - eps_low, 1 + eps_high), 0 outside (strict)
        loss_t = -sg(f(r_t)) A_t log pi_t

    Reference: SkyRL policy_loss_type=rollout_is (skyrl/backends/skyrl_train/utils/ppo_utils.py
    `rollout_is_policy_loss`, commit a9564572eb8e91076be43c1bd5e4615e3de17265; eps_clip_low/high
    defaults). SkyRL anchors r on the rollout's own log-probs; the loss here takes the family's
    old_logp, so the rollout anchor is `proximal=behaviour` (old_logp = mu), and with the default
    proximal it is anchored on pi_old (CISPO's hard-zero sibling). SkyRL's `cispo_anchor=rollout`
    is CISPO's counterpart, clip=cispo_rollout, which moves only the policy loss's anchor
    (proximal=behaviour moves every reader of pi_old: the KL term, rollout_correction, the metrics).
    """
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    with torch.no_grad():
        low, high = ratio <= 1.0 - eps_low, ratio >= 1.0 + eps_high
        weight = torch.where(low | high, torch.zeros_like(ratio), ratio)
    loss = -weight * advantages * logp
    return loss, {"clip/low_frac": float_like(low, loss), "clip/high_frac": float_like(high, loss)}
