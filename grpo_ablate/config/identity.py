"""A run's identity: the hash of what it computes (labels, budget and settings that only observe
excluded), which names its run dir and decides whether a run may resume."""
from __future__ import annotations

import hashlib
import json

from omegaconf import DictConfig, OmegaConf

from grpo_ablate.evals.protocol import GREEDY
from grpo_ablate.tricks.conditions import FILTERS_OFF

# Keys that may differ between a run and its resumption without changing what it computes.
# `diag` only observes (gradient diagnostics never change the update: tests/test_diagnostics.py).
# The micro-batch split changes how a step is computed, not what (tests/test_micro_batches.py), as
# threads do: a run that ran out of memory resumes split, and a split run is the unsplit run's config.
# eval.keep_weights only keeps what the run computes anyway (the weights at each eval step).
RESUMABLE_KEYS = ("steps", "resume", "logger", "run", "sweep", "threads", "diag",
                  "updates.micro_batch_size", "updates.max_tokens_per_forward", "eval.keep_weights")
# settings added after runs existed, hashed only away from the value at which they do nothing (the
# sampler's filters off; the eval protocol every run had before, greedy), so a run started before
# them hashes, and resumes, as it did
HASHED_AWAY_FROM = {**{f"rollout.{key}": off for key, off in FILTERS_OFF.items()}, "rollout.sampling_replay": True,
                    "rollout.stream_salt": 0, **{f"eval.{key}": value for key, value in GREEDY.settings().items()},
                    "eval.name": GREEDY.name}


def config_hash(cfg: DictConfig) -> str:
    """Hash of everything that determines what a run computes (labels and budget excluded)."""
    return data_hash(OmegaConf.to_container(cfg, resolve=True))


def data_hash(data: dict) -> str:
    """config_hash of a config already made plain (`OmegaConf.to_container(cfg, resolve=True)`); `data` is changed."""
    for key in (*RESUMABLE_KEYS, *HASHED_AWAY_FROM):
        *parents, leaf = key.split(".")
        node = data
        for parent in parents:
            node = node.get(parent) or {}
        if key in RESUMABLE_KEYS or node.get(leaf, HASHED_AWAY_FROM[key]) == HASHED_AWAY_FROM[key]:
            node.pop(leaf, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]
