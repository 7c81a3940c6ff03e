"""A run's identity: the hash of what it computes, which names its run dir and decides whether a run
may resume. Each setting's declaration says what the hash does with it (allowed.py): a `resumable` one
is left out, and one with a `neutral` value is hashed only away from it, so a setting or knob added at
its neutral value moves no recorded hash (tests/test_catalogue.py replays every recorded config)."""
from __future__ import annotations

import hashlib
import json

from omegaconf import DictConfig, OmegaConf

from grpo_ablate.allowed import HASHED, Allowed, ReadWhen
from grpo_ablate.config.run_settings import EXEMPT, RUN_SETTINGS
from grpo_ablate.tricks import UnknownOption, families, option
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
        try:
            declared = {**{key: allowed for key, (allowed, _) in family_info(family).settings.items()},
                        **option(family, node.get("name")).ranges}
        except UnknownOption:
            continue
        for key, allowed in declared.items():
            _leave_out(node, key, allowed)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


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
