"""Family `clip`: REINFORCE terms held near pi_old by a quadratic penalty (dro) or a hard ratio
window (rollout_is) (the family and its conventions: clip.py).

`dro` (verl policy_loss.loss_mode=dro, docs/algo/dro.md, verl PR #7245, read at commit
ea53291385ce764019a2b40733605f21d8317583): a REINFORCE term with a quadratic proximal penalty
in place of the clip,

    loss_t = -(A_t log pi_t - beta / 2 (log pi_t - log pi_old_t)^2)
    gradient wrt log pi_t: -A_t + beta (log pi_t - log pi_old_t)

`beta` is verl's `dro_beta` (> 0; 0.1 as twinkle's DROLoss, which mirrors verl's, defaults it).
On-policy (pi = pi_old) the penalty's gradient is 0 and dro is plain REINFORCE, so it acts
only once pi moves from pi_old (several optimizer steps per rollout, or a stale/mismatched
pi_old). Like cispo, its value is not a surrogate objective: compare gradients, not loss values.

`rollout_is` (SkyRL policy_loss_type=rollout_is, skyrl/backends/skyrl_train/utils/ppo_utils.py
`rollout_is_policy_loss`, commit a9564572eb8e91076be43c1bd5e4615e3de17265; GLM-5's loss):

    r_t = exp(log pi_t - log mu_t),  f(r) = r on (1 - eps_low, 1 + eps_high), 0 outside (strict)
    loss_t = -sg(f(r_t)) A_t log pi_t

SkyRL anchors r on the rollout's own log-probs; the loss here takes the family's old_logp, so
the rollout anchor is `proximal=behaviour` (old_logp = mu), and with the default proximal it is
anchored on pi_old (CISPO's hard-zero sibling). SkyRL's `cispo_anchor=rollout` is the same
move for clip=cispo (eps_low 1, eps_high 4 there): clip=cispo proximal=behaviour.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.clip import LOG_RATIO_LIMIT, RATIO_MOVES, float_like
from grpo_ablate.tricks.conditions import ONE_STEP
from grpo_ablate.tricks.registry import POSITIVE, Trick, register


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
    """-(A log pi - beta/2 (log pi - log pi_old)^2) per token (module docstring)."""
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
    """-sg(f(r)) A log pi, f zeroing r outside (1 - eps_low, 1 + eps_high); SkyRL's eps_clip_low/high defaults."""
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    with torch.no_grad():
        low, high = ratio <= 1.0 - eps_low, ratio >= 1.0 + eps_high
        weight = torch.where(low | high, torch.zeros_like(ratio), ratio)
    loss = -weight * advantages * logp
    return loss, {"clip/low_frac": float_like(low, loss), "clip/high_frac": float_like(high, loss)}
