"""When a trick cannot act: one table, read wherever a run or a plan is about to waste compute.

Each rule names the options it covers (by family and option, or by a registry flag), the
condition of a composed config under which they change nothing, why, and what makes them
act. `grpo-ablate train` prints one warning line per inert trick; `sweep` and `doctor`
refuse a plan in which a trick under test is inert (unless --allow-inert); `grpo-ablate
tricks` shows each trick's requirement. What a config cannot tell (an adaptive controller
whose target the task never reaches, a filter that never fires) the report finds afterwards
from the trick's activity metric: report/activity.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from omegaconf import DictConfig

from grpo_ablate.config import trick_families
from grpo_ablate.tricks import option

# Advantage estimators that undo an affine map of the rewards (up to their epsilon):
# (r - mean) / std of a*r + b is (r - mean) / std of r.
SHIFT_AND_SCALE_INVARIANT = ("grpo", "batch", "lite", "rpp_baseline")


def one_optimizer_step(cfg: DictConfig) -> bool:
    return int(cfg.updates.mini_batches) * int(cfg.updates.epochs) == 1


def same_sampler_and_trainer(cfg: DictConfig) -> bool:
    return cfg.rollout.backend == "hf" and str(cfg.rollout.get("dtype") or "float32") == "float32"


def grpo_cannot_reach(cfg: DictConfig) -> bool:
    """adv=grpo on unshaped binary rewards: the largest |A| is a lone success's, (G-1)/sqrt(G)."""
    shaped = (cfg.length.name != "none" or cfg.overlong.name == "soft_punish" or cfg.reward_norm.name != "none"
              or cfg.kl.name == "in_reward" or float(cfg.task.get("format_reward") or 0) != 0)
    group = int(cfg.rollout.group_size)
    return (cfg.adv.name == "grpo" and not shaped and cfg.sampling.get("g_max") is None
            and float(cfg.adv_clip.c) >= (group - 1) / math.sqrt(group))


@dataclass(frozen=True)
class Rule:
    family: str | None              # None: any family
    options: tuple[str, ...]        # the options it covers ...
    flag: str | None                # ... or every option registered with this capability flag
    inert_when: Callable[[DictConfig], bool]
    why: str                        # why it cannot act then ({option} is filled in)
    fix: str                        # what makes it act
    requires: str                   # the requirement, as `grpo-ablate tricks` shows it

    def covers(self, family: str, name: str) -> bool:
        if self.family not in (None, family):
            return False
        if name in self.options:
            return True
        try:
            return self.flag is not None and bool(getattr(option(family, name), self.flag))
        except LookupError:     # a config-only family (dual_clip, updates): no registered function
            return False


RULES = (
    Rule("clip", ("higher",), "off_policy_only", one_optimizer_step,
         "cannot act with one optimizer step per rollout (ρ ≡ 1)", "add updates.mini_batches=4",
         "several optimizer steps per rollout (updates.mini_batches > 1 or updates.epochs > 1)"),
    Rule("dual_clip", ("enabled",), None, one_optimizer_step,
         "cannot act with one optimizer step per rollout (ρ ≡ 1 never exceeds c)", "add updates.mini_batches=4",
         "several optimizer steps per rollout"),
    Rule("value_clip", ("clip",), None, one_optimizer_step,
         "cannot act with one optimizer step per rollout (V never moves away from V_old)",
         "add updates.mini_batches=4", "a critic (adv=gae) and several optimizer steps per rollout"),
    Rule("reward_norm", ("batch",), None, lambda cfg: cfg.adv.name in SHIFT_AND_SCALE_INVARIANT,
         "is undone by the advantage estimator, which normalizes again (an affine map of the rewards "
         "gives the same advantages)", "use adv=dr_grpo or adv=rloo (no division by a std)",
         "an estimator that does not divide by a std (adv=dr_grpo, rloo, gae)"),
    Rule("adv_clip", ("clip",), None, grpo_cannot_reach,
         "cannot act: with adv=grpo on unshaped 0/1 rewards no |A| exceeds (G-1)/sqrt(G), below adv_clip.c",
         "lower adv_clip.c, raise rollout.group_size, or shape the reward", "advantages beyond adv_clip.c"),
    Rule("kl_weight", ("length_budget",), None,
         lambda cfg: int(cfg.kl_weight.budget) >= int(cfg.rollout.max_new_tokens) - 1,
         "cannot act: no completion is longer than kl_weight.budget", "set kl_weight.budget below rollout.max_new_tokens",
         "completions longer than kl_weight.budget"),
    Rule("entropy", ("bonus", "adaptive"), None,
         lambda cfg: cfg.entropy.name == "bonus" and float(cfg.entropy.coef) == 0,
         "cannot act with entropy.coef=0", "set entropy.coef > 0", "entropy.coef > 0 (adaptive: H below its target)"),
    Rule("kl", ("fixed", "adaptive", "adaptive_target", "in_reward", "two_layer"), None,
         lambda cfg: float(cfg.kl.beta) == 0 and float(cfg.kl.get("beta_prev") or 0) == 0,
         "cannot act with kl.beta=0", "set kl.beta > 0", "kl.beta > 0"),
    Rule("kl.estimator", ("k1", "k2", "k3"), None,
         lambda cfg: float(cfg.kl.beta) == 0 and float(cfg.kl.get("beta_prev") or 0) == 0,
         "only changes a logged metric: with kl.beta=0 there is no KL term or penalty", "set kl.beta > 0",
         "a KL term or penalty (kl.beta > 0)"),
    Rule(None, (), "needs_sampler_logprobs", same_sampler_and_trainer,
         "cannot act when the sampler is the trainer itself (same model, same dtype)",
         "sample with rollout.dtype=bfloat16 (or rollout=vllm on a GPU)", "a sampler that differs from the trainer"),
)


def inert_reason(cfg: DictConfig, family: str, name: str) -> str | None:
    """Why option `name` of `family` cannot act in this config, with the fix; None if it can."""
    for rule in RULES:
        if rule.covers(family, name) and rule.inert_when(cfg):
            return f"{rule.why}: {rule.fix}"
    return None


def requirement(family: str, name: str) -> str:
    """What the option needs to act ('' when nothing beyond itself)."""
    return "; ".join(rule.requires for rule in RULES if rule.covers(family, name))


def inert_tricks(cfg: DictConfig, tricks: dict) -> list[tuple[str, str]]:
    """(trick, reason) for every named trick in `tricks` (name -> {family, option}) that cannot
    act in `cfg`, in their order."""
    out = []
    for name, info in tricks.items():
        reason = inert_reason(cfg, info["family"], info["option"])
        if reason is not None:
            out.append((name, reason))
    return out


def chosen_tricks(cfg: DictConfig, overrides) -> dict:
    """The tricks a run was asked for: its named tricks (+trick=...) and the family options
    given explicitly (clip=higher), as name -> {family, option}."""
    chosen = {name: dict(info) for name, info in (cfg.get("tricks") or {}).items()}
    for override in overrides:
        key, _, value = override.lstrip("+").partition("=")
        if key in trick_families() and value and cfg[key].name == value:
            chosen.setdefault(f"{key}={value}", {"family": key, "option": value})
    return chosen
