"""A run's identity: the hash of what it computes, which names its run dir and decides whether a run
may resume. Each setting's declaration says what the hash does with it (allowed.py): a `resumable` one
is left out, and one with a `neutral` value is hashed only away from it, so a setting or knob added at
its neutral value moves no recorded hash (tests/test_catalogue.py replays every recorded config). A family
declared with a `neutral` option is left out whole at that option: adding one moves no hash either."""
from __future__ import annotations

import functools
import hashlib
import json

from omegaconf import DictConfig, OmegaConf

from grpo_ablate.allowed import HASHED, Allowed, ReadWhen
from grpo_ablate.config.run_settings import EXEMPT, RUN_SETTINGS
from grpo_ablate.tricks import UnknownOption, families, option, options
from grpo_ablate.tricks.registry import family_info

LABELS = tuple(prefix.rstrip(".") for prefix, exempt in EXEMPT.items() if exempt.labels)


def config_hash(cfg: DictConfig) -> str:
    """Hash of everything that determines what a run computes (labels and budget excluded)."""
    return data_hash(OmegaConf.to_container(cfg, resolve=True))


def data_hash(data: dict) -> str:
    """config_hash of a config already made plain (`OmegaConf.to_container(cfg, resolve=True)`); `data` is changed."""
    for label in LABELS:
        data.pop(label, None)
    for key, allowed in RUN_SETTINGS.items():
        *parents, leaf = key.split(".")
        node = data
        for parent in parents:
            node = node.get(parent) or {}
        if _leave_out(node, leaf, allowed) and not node and len(parents) == 1:
            data.pop(parents[0])   # a group left out whole (logger, diag): no empty node in the hash
    for family in families():
        node = data.get(family)
        if "." in family or not isinstance(node, dict):
            continue
        if node.get("name") is not None and node.get("name") == family_info(family).neutral:
            data.pop(family)   # a family added later, at the option that changes nothing: as before it existed
            continue
        try:
            chosen = option(family, node.get("name"))
        except UnknownOption:
            continue
        for key, allowed in declarations(chosen).items():
            _leave_out(node, key, allowed)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def declarations(chosen) -> dict[str, Allowed]:
    """What each key of a family's config group may be under its chosen option: the family's settings
    and the option's knobs."""
    return {**{key: allowed for key, (allowed, _) in family_info(chosen.family).settings.items()}, **chosen.ranges}


@functools.cache
def later_keys() -> frozenset[str]:
    """Every key declared with a neutral value (one that came after runs existed), of the run and of
    any option of any family."""
    keys = {key for key, allowed in RUN_SETTINGS.items() if allowed.neutral is not HASHED}
    for family in families():
        keys |= {f"{family}.{key}" for chosen in options(family).values()
                 for key, allowed in declarations(chosen).items() if allowed.neutral is not HASHED}
    return frozenset(keys)


def _leave_out(node: dict, key: str, allowed: Allowed) -> bool:
    """Drop `key` from the hashed data where its declaration says so (absent counts as neutral);
    whether it was there and dropped."""
    neutral = allowed.neutral
    if allowed.resumable:
        unhashed = True
    elif isinstance(neutral, ReadWhen):
        unhashed = not neutral.reads(node)   # nothing reads it under this config
    else:
        unhashed = neutral is not HASHED and node.get(key, neutral) == neutral
    return unhashed and node.pop(key, _ABSENT) is not _ABSENT


_ABSENT = object()
