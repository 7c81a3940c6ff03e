"""Family `proximal`: the policy the PPO ratio is taken against when rollouts are stale.

With stale rollouts three policies meet in the loss (AReaL's terms): the behaviour policy mu
that sampled (`sampler_logp`), the proximal policy pi_prox the ratio pi_theta / pi_prox is
clipped around, and pi_theta being trained. Every option takes (old_logp, sampler_logp, ages,
mask) -- pi_old, the trained policy's log-probs before this rollout's update [N, T] (the
trainer's anchor forward), mu's [N, T], each row's age [N, 1] (policy versions behind pi_old,
family `staleness`) and the trained-token mask -- and returns the proximal log-probs [N, T]
(no gradient), which the policy loss and `rollout_correction` then read as pi_old.

    recompute   pi_prox = pi_old, recomputed by a forward (AReaL `prox_logp_method=recompute`,
                its default; verl `use_rollout_log_probs=false`). The trainer's path without
                this family: the tensor is handed on untouched.
    loglinear   log pi_prox ~ log mu + alpha (log pi_theta - log mu), alpha = (v_prox - v_mu) /
                (v_theta - v_mu) per token, clamped to [0, 1] (AReaL `prox_logp_method=loglinear`,
                areal/trainer/ppo/actor.py `compute_prox_logp_approximations`; docs
                prox_approx). Which versions: knob `versions`, below.
    behaviour   pi_prox = mu: the ratio against the sampler's log-probs directly (verl
                `use_rollout_log_probs=true` / one-step-off's bypass, prime-rl, TRL AsyncGRPO).
    train_logp  pi_prox = the training forward's own log-probs, detached (AReaL
                `prox_logp_method=reuse_train_logp`): no proximal forward, the ratio is 1 in
                every mini-batch, so the clip never binds and only the importance weights
                (`rollout_correction`, AReaL's behaviour weight) keep the update off-policy-aware.

loglinear's versions. AReaL's bookkeeping: the trainer's engine and the rollout
engine both hold version V = global_step + 1 after an update, a token is tagged with the version
that sampled it, and the loss takes v_theta = engine.get_version() = V, v_prox = V - 1 (the
comment: "the last broadcast"). A row of age a here (a versions behind pi_old, which is the
policy at V) has v_mu = V - a, so AReaL's code computes

    versions=areal (default)   alpha = (a - 1) / a  for a >= 1, 0 for a = 0:  0, 0, 1/2, 2/3, 3/4 (ages 0..4)

AReaL is itself inconsistent there: its recomputed pi_prox (prox_logp_method=recompute) is the
forward of version V, not V - 1. Reading the approximation as "pi_prox is pi_old (version V) and
pi_theta one version ahead" gives the other mapping, this project's earlier one:

    versions=next              alpha = a / (a + 1):  0, 1/2, 2/3, 3/4, 4/5

The default follows AReaL's code, since that is what a user of AReaL runs; tests/test_areal_
conventions.py shows both tables. A sampler log-prob that is not finite is unknown: pi_prox =
pi_old on that token (tricks/behaviour.py; AReaL raises).

Convention difference (loglinear): AReaL evaluates the interpolation in every mini-batch with
that forward's pi_theta; here pi_theta's log-probs are the anchor forward's (pi_theta at the
rollout's first optimizer step, which is every step with updates.mini_batches=1, AReaL's
setting too), so the forward AReaL skips is still run: this ablates what the approximation does
to the objective, not its speed.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.behaviour import known_or
from grpo_ablate.tricks.conditions import one_optimizer_step, truncation_unreplayed
from grpo_ablate.tricks.registry import Activity, Inert, Trick, choice, declare_family, register

declare_family("proximal", "the PPO ratio's denominator under stale rollouts: `recompute` π_old (AReaL's default), "
               "AReaL's `loglinear` approximation, the `behaviour` policy's own log-probs, or the training "
               "forward's own (`train_logp`)",
               stage="async", default="recompute",
               metric="proximal/gap")


def _no_staleness(cfg) -> bool:
    # a truncating sampler without the replay scores another distribution than pi_old: mu differs anyway
    return cfg.staleness.name == "none" and not truncation_unreplayed(cfg)


WITHOUT_STALENESS = Inert(_no_staleness, "changes little without stale rollouts: the sampler is the current policy",
                          "add staleness=fixed", "staleness other than none")


def _gap(proximal, old_logp, mask) -> dict:
    """How far the proximal log-probs used are from pi_old's (0 for recompute)."""
    mask = mask.to(old_logp.dtype)
    gap = ((proximal - old_logp).abs() * mask).sum() / mask.sum().clamp(min=1)
    return {"proximal/gap": gap.item()}


@register("proximal", "recompute",
          what="the PPO ratio against pi_old recomputed by a forward before the update (AReaL's default)")
def recomputed_proximal(old_logp, sampler_logp, ages, mask):
    """pi_prox = pi_old, as it is (no metrics: the trainer's path without the family)."""
    return old_logp, {}


def interpolation_weight(ages: torch.Tensor, versions: str) -> torch.Tensor:
    """alpha per row from its age (see the module docstring): AReaL's code, or one version ahead."""
    if versions == "areal":     # (v_prox - v_mu) / (v_theta - v_mu) with v_theta = V, v_prox = V - 1, v_mu = V - a
        return torch.where(ages > 0, (ages - 1.0) / ages.clamp(min=1.0), torch.zeros_like(ages)).clamp(0.0, 1.0)
    return (ages / (ages + 1.0)).clamp(0.0, 1.0)


@register("proximal", "loglinear",
          what="AReaL prox_logp_method=loglinear: log pi_prox ~ log mu + alpha (log pi_theta - log mu)",
          notes={"versions": "alpha = (age - 1) / age as AReaL's code computes it; next: age / (age + 1)"},
          needs_sampler_logprobs=True, activity=Activity("proximal/gap"),
          inert=WITHOUT_STALENESS,
          knobs={"versions": choice("areal", "next")},
          tricks=(Trick("proximal_loglinear",
                        what="AReaL's log-linear approximation of the proximal policy, alpha = (age - 1) / age "
                             "as AReaL's code computes it",
                        source="AReaL actor.prox_logp_method=loglinear (areal/trainer/ppo/actor.py)",
                        verdict="not_in_review", cost="none (AReaL: saves a forward; here it is still run)"),))
def loglinear_proximal(old_logp, sampler_logp, ages, mask, *, versions: str = "areal"):
    """log mu + alpha (log pi_theta - log mu), alpha from the row's age by `versions`; pi_theta's from
    the anchor forward; an unknown mu is pi_old's."""
    with torch.no_grad():
        alpha = interpolation_weight(ages.to(old_logp.dtype), versions)
        behaviour = known_or(sampler_logp, old_logp)
        proximal = torch.where(mask > 0, behaviour + alpha * (old_logp - behaviour), old_logp)
        return proximal, _gap(proximal, old_logp, mask)


@register("proximal", "behaviour",
          what="the PPO ratio against the sampler's own log-probs (verl use_rollout_log_probs, prime-rl, TRL "
               "AsyncGRPO)",
          needs_sampler_logprobs=True, activity=Activity("proximal/gap"),
          inert=WITHOUT_STALENESS,
          tricks=(Trick("proximal_behaviour",
                        what="the PPO ratio against the behaviour policy's own log-probs (no recomputed pi_old)",
                        source="verl actor.use_rollout_log_probs; prime-rl; TRL AsyncGRPO",
                        verdict="not_in_review"),))
def behaviour_proximal(old_logp, sampler_logp, ages, mask):
    """pi_prox = mu on trained tokens (an unknown sampler log-prob falls back to pi_old's)."""
    with torch.no_grad():
        proximal = torch.where(mask > 0, known_or(sampler_logp, old_logp), old_logp)
        return proximal, _gap(proximal, old_logp, mask)


@register("proximal", "train_logp",
          what="AReaL prox_logp_method=reuse_train_logp: the PPO ratio against the training forward's own detached "
               "log-probs (rho = 1 in every mini-batch; only the importance weights act off-policy)",
          reuses_train_logp=True, activity=Activity("proximal/train_logp_gap"),
          writes=("proximal/gap", "proximal/train_logp_gap"),
          inert=Inert(one_optimizer_step, "is recompute with one optimizer step per rollout: the training forward "
                      "is pi_old", "add updates.mini_batches=4",
                      "several optimizer steps per rollout (updates.mini_batches > 1 or updates.epochs > 1)"),
          tricks=(Trick("reuse_train_logp",
                        what="the PPO ratio against the training forward's own detached log-probs (rho = 1): no "
                             "proximal forward, the clip never binds",
                        source="AReaL actor.prox_logp_method=reuse_train_logp", verdict="not_in_review",
                        cost="none (saves AReaL's proximal forward; here pi_old's forward still runs when "
                             "another trick reads it)"),))
def train_logp_proximal(old_logp, sampler_logp, ages, mask):
    """pi_prox = pi_theta.detach() of each mini-batch's own forward (AReaL areal/trainer/ppo/actor.py
    `grpo_loss_fn`: `if prox_logp_method == REUSE_TRAIN_LOGP: prox_logp_gt = logprobs.detach()`, commit
    4aef98d). The substitution happens in the loss (train/losses.py, by the `reuses_train_logp` flag),
    where the forward is; this function hands pi_old on for what is computed once per rollout.
    Difference: AReaL's behaviour weight pi_prox / mu is then this forward's over mu, per mini-batch;
    here `rollout_correction`'s weights are pi_old / mu, computed once per rollout (the same on the
    rollout's first optimizer step). `proximal/train_logp_gap` is |log pi_theta - log pi_old| over the
    trained tokens: 0 on a rollout's first optimizer step, and how far the clip would have looked after;
    `proximal/gap` is 0 (what is handed on is pi_old itself)."""
    return old_logp, _gap(old_logp, old_logp, mask)
