"""The trick catalogue: pure tensor functions registered by name, one module per family.

This package imports only torch. Each family module registers its options in
`registry.py` (`register(family, option)`); the trainer asks the registry for the option its
config chose (`option("adv", cfg.adv.name)`) and never branches on a name itself, so adding
a trick is one registered function, one YAML file and one test. Importing the package
registers every family.
"""
from grpo_ablate.tricks import (adv, adv_clip, clip, entropy, kl, kl_weight, length, loss_agg, off_policy_mask,
                                overlong, ref_sync, reward_norm, rollout_correction, sampling, temperature,
                                token_mask, value)
from grpo_ablate.tricks.registry import Option, UnknownOption, families, option, options

# imported for their registrations
FAMILY_MODULES = (adv, adv_clip, clip, entropy, kl, kl_weight, length, loss_agg, off_policy_mask, overlong,
                  ref_sync, reward_norm, rollout_correction, sampling, temperature, token_mask, value)
__all__ = ["FAMILY_MODULES", "Option", "UnknownOption", "families", "option", "options"]
