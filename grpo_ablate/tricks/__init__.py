"""The trick catalogue: pure tensor functions registered by name, one module per family.

This package imports only torch. Each family module declares its family and registers its
options in `registry.py` (`register(family, option, knobs=..., activity=..., inert=...,
tricks=...)`): the implementation and every fact about it (knob ranges, the metric that
shows it acted, when it cannot act, the named tricks with their catalogue text). The trainer
asks the registry for the option its config chose (`option("adv", cfg.adv.name)`) and never
branches on a name itself; config checks, inert warnings, the report's activity table, the
catalogue, docs/tricks.md and docs/config.md's option table are all read from the registry
(grpo_ablate/catalogue.py). Adding an option is one registered function, its
`conf/<family>/<option>.yaml` and its `conf/trick/<name>.yaml`; adding a family is those,
one entry in FAMILIES below and its call site in the loss or reward chain.
"""
import importlib
import pkgutil

from grpo_ablate.tricks.registry import Option, UnknownOption, families, option, options

# Every family, in the order docs/config.md's option table shows them (the trainer's order:
# sampling and reward shaping, the advantage chain, the policy loss and its terms).
FAMILIES = ("overlong", "length", "reward_norm", "sampling", "prompt_pool", "adv", "value_clip", "adv_clip", "clip",
            "dual_clip", "loss_agg", "kl", "kl_weight", "entropy", "token_mask", "off_policy_mask",
            "rollout_correction", "staleness", "proximal", "ref_sync", "temperature", "lm_head", "updates",
            "optim_state", "lr_scale")
# every module of the package, imported for its declarations and registrations
FAMILY_MODULES = tuple(importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)
                       if m.name not in ("registry", "conditions", "behaviour"))
__all__ = ["FAMILIES", "FAMILY_MODULES", "Option", "UnknownOption", "families", "option", "options"]
