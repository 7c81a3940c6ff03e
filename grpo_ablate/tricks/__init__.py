"""The trick catalogue: pure tensor functions registered by name, one module per family.

This package imports only torch. Each family module registers its options in
`registry.py` (`register(family, option)`); the trainer asks the registry for the option its
config chose (`option("adv", cfg.adv.name)`) and never branches on a name itself, so adding
a trick is one registered function, one YAML file and one test. Importing the package
registers every family.
"""
from grpo_ablate.tricks import (adv, adv_clip, clip, entropy, kl, kl_weight, length, loss_agg, overlong,
                                reward_norm, sampling, temperature, value)
from grpo_ablate.tricks.registry import Option, UnknownOption, families, option, options

FAMILY_MODULES = (adv, adv_clip, clip, entropy, kl, kl_weight, length, loss_agg, overlong, reward_norm, sampling,
                  temperature, value)   # imported for their registrations
__all__ = ["FAMILY_MODULES", "Option", "UnknownOption", "families", "option", "options"]
