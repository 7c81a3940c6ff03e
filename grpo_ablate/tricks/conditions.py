"""Conditions of a composed config that the options' inert rules (registry.Inert) and checks share.

Each reads the config by attribute only (a DictConfig, or any object with the same keys), so
this package still imports nothing but torch. The rules themselves are given where each option
is registered; grpo_ablate/config/inert.py reads them from the registry.
"""
from __future__ import annotations

import math

from grpo_ablate.tricks.registry import Inert, families, option


def single_turn_task(cfg) -> bool:
    """A task group without `max_turns` is a single completion: one turn, no environment token."""
    return cfg.task.get("max_turns") is None


def one_optimizer_step(cfg) -> bool:
    return int(cfg.updates.mini_batches) * int(cfg.updates.epochs) == 1


# each sampling filter's value that keeps every token (conf/rollout/*.yaml's defaults)
FILTERS_OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}


def sampler_truncates(cfg) -> bool:
    """rollout.top_k, top_p or min_p away from off: each token is drawn from a kept set, renormalised."""
    return any(cfg.rollout.get(key, off) != off for key, off in FILTERS_OFF.items())


def truncation_unreplayed(cfg) -> bool:
    """The sampler truncates and rollout.sampling_replay=false: the sampler's log-probs are over its
    kept set, the trainer's over the whole vocabulary, so the two differ by the kept mass."""
    return sampler_truncates(cfg) and not bool(cfg.rollout.get("sampling_replay", True))


def same_sampler_and_trainer(cfg) -> bool:
    """The current policy samples in the trainer's dtype from the distribution the trainer scores: no
    mismatch, no staleness (k = 0), no kept set left unreplayed."""
    staleness = cfg.get("staleness")
    return (cfg.rollout.backend == "hf" and str(cfg.rollout.get("dtype") or "float32") == "float32"
            and (staleness is None or staleness.name == "none") and not truncation_unreplayed(cfg))


def policy_never_leaves_sampler(cfg) -> bool:
    """pi_theta == pi_old == the sampler: one optimizer step and no sampler-trainer mismatch."""
    return one_optimizer_step(cfg) and same_sampler_and_trainer(cfg)


def total_optimizer_steps(cfg) -> int:
    """The run's optimizer steps (mini-batches are capped at the rollout's groups)."""
    mini_batches = min(int(cfg.updates.mini_batches), int(cfg.rollout.prompts_per_step))
    return int(cfg.steps) * mini_batches * int(cfg.updates.epochs)


def no_kl_term(cfg) -> bool:
    return float(cfg.kl.beta) == 0 and float(cfg.kl.get("beta_prev") or 0) == 0


def ratio_on_sampler(cfg) -> bool:
    """An option of the config takes the policy loss's ratio against the sampler's log-probs mu
    (registered with ratio_on_sampler=True: clip=cispo_rollout, the combined-ratio corrections)."""
    return any(option(family, cfg[family].name).ratio_on_sampler for family in families()
               if family in cfg and "name" in cfg[family])


def ratio_is_one(cfg) -> bool:
    """One optimizer step and the ratio's denominator pi_old itself (proximal=recompute, and no option
    moves the policy loss's ratio onto the sampler), or the sampler's log-probs when they equal
    pi_old's: rho == 1. With proximal=train_logp the denominator is the training forward's own
    log-probs: rho == 1 at every step (ratio_is_reused)."""
    proximal = cfg.get("proximal")
    return one_optimizer_step(cfg) and (same_sampler_and_trainer(cfg) or (
        (proximal is None or proximal.name == "recompute") and not ratio_on_sampler(cfg)))


def ratio_is_reused(cfg) -> bool:
    """proximal=train_logp: the ratio's denominator is the training forward itself, rho == 1 always."""
    proximal = cfg.get("proximal")
    return proximal is not None and proximal.name == "train_logp"


# the rules every ratio-based option shares (registered with off_policy_only=True)
ONE_STEP = (Inert(ratio_is_one, "cannot act with one optimizer step per rollout (ρ ≡ 1)",
                  "add updates.mini_batches=4",
                  "several optimizer steps per rollout (updates.mini_batches > 1 or updates.epochs > 1)"),
            Inert(ratio_is_reused, "cannot act with proximal=train_logp (ρ ≡ 1: the ratio is against the training "
                  "forward's own log-probs)", "use proximal=recompute",
                  "a ratio against π_old (not proximal=train_logp)"))


def shapes_the_reward(cfg) -> bool:
    """An option of the config adds a term to the reward (registered with shapes_reward=True)."""
    return any(option(family, cfg[family].name).shapes_reward for family in families() if family in cfg)


def grpo_cannot_reach(cfg) -> bool:
    """adv=grpo on unshaped binary rewards: the largest |A| is a lone success's, (G-1)/sqrt(G)."""
    shaped = (shapes_the_reward(cfg) or cfg.reward_norm.name != "none"
              or float(cfg.task.get("format_reward") or 0) != 0)
    group = int(cfg.rollout.group_size)
    return (cfg.adv.name == "grpo" and not shaped and cfg.sampling.get("g_max") is None
            and float(cfg.adv_clip.c) >= (group - 1) / math.sqrt(group))


def splits_forward(cfg) -> str | None:
    """The setting that splits an optimizer step's forward into micro-batches (None: one forward)."""
    updates = cfg.updates
    for key in ("micro_batch_size", "max_tokens_per_forward"):
        if updates.get(key) is not None:
            return f"updates.{key}={updates[key]}"
    return None


def one_forward_statistic(what: str, unless=lambda cfg: False):
    """The check of an option whose loss reads a statistic over the rows of one forward (`what`):
    micro-batches would change it, so the split is refused (`unless(cfg)`: the option's
    settings that do without the statistic)."""
    def check(cfg) -> str | None:
        split = splits_forward(cfg)
        return None if split is None or unless(cfg) else (
            f"{what} is over the rows of one forward, so {split} would change the loss; "
            "allowed: updates.micro_batch_size=null and updates.max_tokens_per_forward=null with it")
    return check
