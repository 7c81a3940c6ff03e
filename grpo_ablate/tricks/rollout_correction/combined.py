"""Family `rollout_correction`, the combined-ratio gates: asynchronous GRPO without pi_old (TRL AsyncGRPO,
issue #6945, PR #7120).

An asynchronous trainer that keeps no older weights cannot recompute pi_old for a rollout the stale
policy mu sampled: the only ratio it has is the combined one, rho = pi_theta / mu, staleness and the
sampler-trainer mismatch folded together, and its PPO loss is taken on it (TRL AsyncGRPO:
`coef_1 = exp(log_probs - old_log_probs)` with vLLM's log-probs as `old_log_probs`). The correction
gates each token's policy loss on that same ratio, detached:

    rho_t  = exp(clamp(log pi_theta_t - log mu_t, -20, 20))        (0 in log space where mu is unknown)
    truncate:  g_t = clamp(rho_t, low, high) / rho_t                (computed in log space; low None: none)
    mask:      g_t = 1[low <= rho_t <= high]                         (level=sequence: rho of the whole
               sequence, exp(sum_t log rho_t), one gate for all its tokens)
    loss_t = g_t * policy_loss_t(rho_t),  g_t without gradient

Under PPO clip's unclipped branch the gradient of rho_t A_t is rho_t A_t grad log pi_t, so truncation
leaves clamp(rho_t, low, high) A_t grad log pi_t: each token's effective weight capped at the
bounds, tokens in range untouched (the PR's reason for dividing by rho). That identity holds for a loss
linear in rho (PPO clip, the PR's loss); another policy loss is multiplied by the same g.

Why new options, not a composition of existing ones (tests/test_combined_ratio.py shows each on a hand
vector): the other options' weights are pi_old / mu, taken once per rollout. With proximal=behaviour
(pi_old := mu, the PPO ratio becomes the combined ratio) those weights are mu / mu = 1 on every token,
so nothing is truncated; with pi_old recomputed, TIS's clamp(pi_old / mu) matches the gate's effective
weight only on the first optimizer step and only where PPO's clip does not bind on pi_theta / mu (the
PPO ratio there is pi_theta / pi_old, so a token far from mu still moves). The combined ratio needs
pi_theta, which changes in every mini-batch: these options are computed in the loss, per forward.

How the trainer runs them (capability flags, train/losses.py): `reads_current_policy` -- the loss calls
the option with its forward's own detached log-probs in `old_logp`'s place (not once per rollout), and
the option returns per-token statistics (the loss's convention: meaned over each optimizer step's
trained tokens, so micro-batches and ranks add up to the unsplit step); `ratio_on_sampler` -- the
policy loss's ratio is taken against mu (as clip=cispo_rollout's is), so the correction is the PR's
under any `proximal` option that leaves pi_old alone (recompute, behaviour: the same policy term; the
KL term and the ratio metrics keep pi_old, behaviour moves those too). No pi_old forward is asked for:
the trainer the PR corrects has none.

Read at: TRL PR #7120 "Add importance-sampling correction to AsyncGRPO" (open; head c48ed94a, the
revision its first review ran, read in its description and review threads: the branch is not in
the stored mirror), issue #6945 (the design comment); TRL f2cd57710 (main) for the loss it gates
(trl/experimental/async_grpo/async_grpo_trainer.py `compute_loss`) and the synchronous modes'
defaults (grpo_config.py: clip_max 3.0, clip_min None). Decisions where they disagree or are silent:
- `sequence_truncate` is not built: clamp(rho_seq) / rho_seq multiplies per-token ratios by a
  sequence product, which overflows (the review's first blocking finding: 0.8 / 0.7^300 = inf) and
  is no identity there; TRL's synchronous sequence_truncate multiplies by clamp(rho_seq) itself,
  which the other options here already are.
- The mask's level defaults to `token`: the PR's default (sequence_mask, clip_max 3, as sync) masks
  whole stale batches under mild drift (a mean log-ratio of 0.005 over 300 tokens is a product of
  4.48; the review's second blocking finding); `level=sequence` is the PR's mode, for that contrast.
- The bounds are TRL's synchronous defaults (high 3, no low), which the PR takes over.
"""
from __future__ import annotations

import math

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.behaviour import log_ratio as behaviour_log_ratio
from grpo_ablate.tricks.conditions import policy_never_leaves_sampler
from grpo_ablate.tricks.registry import POSITIVE, Activity, Allowed, Claim, Inert, Trick, choice, register
from grpo_ablate.tricks.rollout_correction.weights import LOG_RATIO_LIMIT

TRL_ASYNC = "TRL #6945 / PR #7120 (AsyncGRPO importance-sampling correction)"
# what the PR's author argues for both modes (its description; no run is reported)
BOUNDED = Claim("helps", "", TRL_ASYNC, "bounding the combined ratio removes the negative-advantage branch that grows "
                "linearly in pi / mu under staleness (argued from the loss; no run reported)")
SOURCE = ("TRL PR #7120 (open, head c48ed94a): AsyncGRPOConfig vllm_importance_sampling_mode={mode} on the "
          "combined ratio pi_theta / mu (issue #6945)")
BOUNDS = {"high": POSITIVE, "low": Allowed(low=0, low_open=True, high="rollout_correction.high", optional=True)}
NOTES = {"high": "TRL vllm_importance_sampling_clip_max (its default, which the PR keeps)",
         "low": "TRL vllm_importance_sampling_clip_min (null: none, its default)"}
NEVER_OFF_THE_SAMPLER = Inert(
    policy_never_leaves_sampler, "cannot act: with one optimizer step and the sampler the trainer itself, "
    "pi_theta / mu ≡ 1", "sample with staleness=fixed (or rollout.dtype=bfloat16), or add updates.mini_batches=4",
    "a sampler that differs from the trainer (stale rollouts, bf16, vLLM) or several optimizer steps per rollout")


def _approximated_proximal(cfg) -> str | None:
    """A proximal option that replaces pi_old by an approximation would reach only the KL term here:
    the policy loss's ratio is against mu (the option's `ratio_on_sampler`)."""
    proximal = cfg.get("proximal")
    if proximal is None or proximal.name in ("recompute", "behaviour"):
        return None
    return (f"rollout_correction={cfg.rollout_correction.name} takes the policy loss's ratio against the sampler's "
            f"log-probs mu itself (no pi_old: TRL AsyncGRPO), so proximal={proximal.name}'s pi_prox would reach only "
            "the KL term and the metrics; use proximal=recompute or proximal=behaviour")


def combined_log_ratio(policy_logp, sampler_logp, mask):
    """log(pi_theta / mu) per trained token, clamped to [-20, 20] (0 where mu is unknown, and off the mask)."""
    return behaviour_log_ratio(policy_logp, sampler_logp).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT) * mask


@register("rollout_correction", "combined_truncate",
          what="asynchronous GRPO without pi_old (TRL AsyncGRPO, PR #7120): the PPO ratio against the sampler mu, "
               "each token's loss times clamp(rho, low, high) / rho, rho = pi_theta / mu detached",
          notes=NOTES, knobs=BOUNDS,
          needs_sampler_logprobs=True, reads_current_policy=True, ratio_on_sampler=True,
          activity=Activity("rollout_corr/truncated_frac"), inert=NEVER_OFF_THE_SAMPLER, checks=_approximated_proximal,
          writes=("rollout_corr/is_mean", "rollout_corr/truncated_frac", "rollout_corr/logp_diff_mean"),
          tricks=Trick("combined_ratio_truncate",
                       what="asynchronous GRPO without pi_old: PPO on the combined ratio pi_theta / mu, each token's "
                            "effective weight capped at 3 by the gate clamp(rho, max=3) / rho",
                       source=SOURCE.format(mode="token_truncate"), verdict="not_in_review",
                       cost="none (no pi_old forward)", claims=(BOUNDED,)))
def combined_truncate_gate(old_logp, sampler_logp, mask, *, high: float = 3.0, low: float | None = None):
    """(g [N, T], per-token statistics): g = clamp(rho, low, high) / rho on the trained tokens, 0 elsewhere,
    rho = pi_theta / mu with `old_logp` the loss forward's own detached log-probs (`reads_current_policy`).
    In log space, as the PR computes it: g = exp(clamp(log rho, log low, log high) - log rho), exactly 1
    in range. Hand case: log rho = (log 4, log 2, log 0.25) at high 3, low 0.5: g = (3/4, 1, 2)."""
    with torch.no_grad():
        mask_f = mask.to(old_logp.dtype)
        log_rho = combined_log_ratio(old_logp, sampler_logp, mask_f)
        bounded = log_rho.clamp(min=None if low is None else math.log(low), max=math.log(high))
        gate = torch.exp(bounded - log_rho) * mask_f
        truncated = ((bounded != log_rho) & (mask_f > 0)).to(mask_f.dtype)
        return gate, {"rollout_corr/is_mean": gate, "rollout_corr/truncated_frac": truncated,
                      "rollout_corr/logp_diff_mean": log_rho.abs()}


@register("rollout_correction", "combined_mask",
          what="asynchronous GRPO without pi_old (TRL AsyncGRPO, PR #7120): the PPO ratio against the sampler mu, "
               "tokens (or sequences) whose rho = pi_theta / mu lies outside [low, high] get no policy loss",
          notes={**NOTES, "level": "token | sequence (the PR's default mode: rho of the whole sequence, "
                                   "exp(sum log rho))"},
          knobs={**BOUNDS, "level": choice("token", "sequence")},
          needs_sampler_logprobs=True, reads_current_policy=True, ratio_on_sampler=True,
          activity=Activity("rollout_corr/masked_frac"), inert=NEVER_OFF_THE_SAMPLER, checks=_approximated_proximal,
          writes=("rollout_corr/is_mean", "rollout_corr/masked_frac", "rollout_corr/logp_diff_mean"),
          tricks=Trick("combined_ratio_mask",
                       what="asynchronous GRPO without pi_old: PPO on the combined ratio pi_theta / mu, tokens whose "
                            "ratio exceeds 3 masked out of the policy loss",
                       source=SOURCE.format(mode="token_mask"), verdict="not_in_review",
                       cost="none (no pi_old forward)", claims=(BOUNDED,)))
def combined_mask_gate(old_logp, sampler_logp, mask, *, high: float = 3.0, low: float | None = None,
                       level: str = "token"):
    """(g [N, T], per-token statistics): g = 1 where rho lies in [low, high], else 0 (and 0 off the
    mask), rho = pi_theta / mu per token or, at level=sequence, exp(sum_t log rho_t) clamped to
    [e^-20, e^20] on every token of the sequence (TRL sums the log-ratios, its sequence modes). The
    bounds compare the ratio itself, as TRL's masks do. Hand case: log rho = (log 4, log 2, log 0.25)
    at high 3, low 0.5: g = (0, 1, 0); at level=sequence the sum is log 2: g = (1, 1, 1)."""
    with torch.no_grad():
        mask_f = mask.to(old_logp.dtype)
        log_rho = combined_log_ratio(old_logp, sampler_logp, mask_f)
        tested = log_rho if level == "token" else \
            log_rho.sum(dim=-1, keepdim=True).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).expand_as(log_rho)
        rho = torch.exp(tested)
        inside = (rho <= high) & (rho >= (0.0 if low is None else low))
        gate = inside.to(mask_f.dtype) * mask_f
        masked = (~inside & (mask_f > 0)).to(mask_f.dtype)
        return gate, {"rollout_corr/is_mean": gate, "rollout_corr/masked_frac": masked,
                      "rollout_corr/logp_diff_mean": log_rho.abs()}
