"""rollout.backend=vllm: a vLLM engine in this process samples the completions (CUDA GPUs only).

    pip install 'grpo-ablate[vllm]'
    grpo-ablate train model=hf model.path=Qwen/Qwen2.5-0.5B-Instruct model.dtype=bfloat16 rollout=vllm

- Colocated: vLLM loads its own copy of model.path on this process's GPU (in model.dtype) and
  may use rollout.gpu_memory_utilization of that GPU's memory (weights + KV cache); the
  trainer uses the rest. Under torchrun every rank runs its own engine on its own GPU
  (vLLM's external_launcher executor) and samples its share of the prompts.
- The policy's weights are pushed into the engine before the first rollout (so a resumed
  run samples from its checkpoint) and after every optimizer step; a LoRA policy is merged
  for the push and unmerged after.
- The loss's log-probs are always recomputed by the training model. vLLM's own, taken after
  temperature scaling (logprobs_mode=processed_logprobs), are kept only to log how far the
  two are apart (rollout/logprob_gap_mean|max), as TRL and verl do.
- Each prompt gets its own sampling seed (from the run's stream, or keyed by its row with
  rollout.rng=per_row), so a rollout does not depend on vLLM's batching.

Written against vLLM's documented offline API (LLM, SamplingParams, token-id prompts) and
the in-process weight loading TRL's colocate mode uses; not run on a GPU in this repository's
CI (there is none), so treat it as untested until tests/test_vllm_gpu.py has passed on one.
"""
from __future__ import annotations

import os
import socket

import torch

from grpo_ablate.models import model_dir
from grpo_ablate.sampling.decode import Rollout, derived_seed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


class VLLMEngine:
    def __init__(self, cfg, policy, tokenizer, dp):
        # The engine core runs in this process, so weights can be pushed into its model directly.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # external_launcher joins torchrun's process group, or makes a one-process group itself.
        for key, value in (("RANK", dp.rank), ("LOCAL_RANK", dp.local_rank), ("WORLD_SIZE", dp.world),
                           ("MASTER_ADDR", "localhost"), ("MASTER_PORT", _free_port())):
            os.environ.setdefault(key, str(value))
        from vllm import LLM

        rollout = cfg.rollout
        self.device = next(policy.parameters()).device
        source = str(model_dir(cfg.model))   # a GGUF file: the same converted folder the trainer loaded
        self.llm = LLM(
            model=source, tokenizer=source,
            dtype=str(cfg.model.dtype), seed=int(cfg.seed) + dp.rank,
            gpu_memory_utilization=float(rollout.gpu_memory_utilization),
            max_model_len=rollout.max_model_len, enforce_eager=bool(rollout.enforce_eager),
            distributed_executor_backend="external_launcher",
            logprobs_mode="processed_logprobs",   # log-probs after temperature, like the trainer's
            generation_config="vllm",             # no sampling defaults from the model's config
            enable_prefix_caching=True,           # the G completions of a prompt share its KV cache
        )
        self.sync(policy)

    @torch.no_grad()
    def sync(self, policy) -> None:
        """Push the policy's current weights into the engine (LoRA: merged for the push)."""
        lora = hasattr(policy, "merge_adapter")
        if lora:
            policy.merge_adapter()
        try:
            model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
            model.load_weights(self._weights(policy, lora))
        finally:
            if lora:
                policy.unmerge_adapter()
        self.llm.reset_prefix_cache()   # cached prompt states came from the old weights

    @staticmethod
    def _weights(policy, lora: bool):
        for name, tensor in policy.state_dict().items():
            if lora:   # peft names: base_model.model.<name> with .base_layer; adapters already merged
                if "lora_" in name:
                    continue
                name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            yield name, tensor

    def generate(self, prompts: list[list[int]], *, num_samples: int, max_new_tokens: int, temperature: float,
                 eos_id, pad_id: int, generator: torch.Generator | None = None, noise=None) -> Rollout:
        from vllm import SamplingParams

        if noise is not None:   # rollout.rng=per_row: a seed per prompt, keyed by its place in the batch
            first = noise.first // num_samples
            seeds = [derived_seed(noise.seed, first + i) for i in range(len(prompts))]
        else:                   # from the run's stream (checkpointed): resumable
            base = int(torch.randint(2 ** 31, (1,), generator=generator))
            seeds = [base + i for i in range(len(prompts))]
        stop = list(eos_id) if isinstance(eos_id, (list, tuple)) else [int(eos_id)]
        params = [SamplingParams(n=num_samples, temperature=temperature, max_tokens=max_new_tokens, logprobs=0,
                                 stop_token_ids=stop, seed=seed, detokenize=False) for seed in seeds]
        requests = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        rows = [(prompt, out) for prompt, request in zip(prompts, requests)
                for out in sorted(request.outputs, key=lambda o: o.index)]
        return _as_rollout(rows, pad_id).to(self.device)


def _as_rollout(rows, pad_id: int) -> Rollout:
    """vLLM outputs as the trainer's Rollout: prompts left-padded, completions right-padded, the
    stop token included (trained, as in rollout.generate), vLLM's log-prob of each token kept."""
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
    return Rollout(sequences, attention, width, completion_mask, truncated, sampler_logprobs)
