"""The sampler's settings: its piece of the frozen run spec (config/spec.py makes it from the config)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from grpo_ablate.sampling.filters import SamplingFilters


@dataclass(frozen=True)
class RolloutSettings:
    backend: str                 # hf | vllm
    prompts_per_step: int        # B
    group_size: int              # G
    max_new_tokens: int
    dtype: str | None            # the sampler's precision (None: the trainer's, rollout=vllm)
    lean_decoder: bool
    rng: str                     # auto | stream | per_row
    options: Mapping[str, Any]   # every key of the rollout group (rollout=vllm's engine settings: max_model_len, ...)
    filters: SamplingFilters = SamplingFilters()   # top_k, top_p, min_p (sampling/filters.py)
    score_kept_sets: bool = True  # rollout.sampling_replay: the trainer scores the sampler's kept sets (forward.py)
    stream_salt: int = 0          # the sampler's own stream from the same seed (decode.sampler_seed; sweep aa)
