"""GPU throughput of a GRPO training step, rollout=hf against rollout=vllm (see benchmarks/README.md).

    python benchmarks/gpu_throughput.py                       # both backends, defaults below
    python benchmarks/gpu_throughput.py --backend hf --prompts 16 --group 8 --max-new-tokens 512

The model is a randomly initialised Qwen2.5-0.5B-shaped Qwen2 built from a config (nothing is
downloaded), saved with a synthetic tokenizer of the same vocabulary size (single characters
for printable ASCII, placeholder tokens for the rest); the prompts are the shipped word
problems (tests/data/word_problems.jsonl), one character per token. A random model almost
never emits EOS, so every completion runs to --max-new-tokens: each step processes the same
number of tokens, and the figures compare. Each backend runs in a fresh process through the
real trainer (`grpo-ablate train` in-process); the first --warmup steps are dropped.

Prints one JSON line per backend:
    {"backend", "gpu", "steps", "prompts", "group", "max_new_tokens", "dtype", "beta",
     "step_s", "sample_s", "update_s", "completion_tokens", "tokens_per_s", "peak_gpu_mem_gb"}
with medians over the timed steps; tokens_per_s = completion tokens / step time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import string
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

REPO = Path(__file__).resolve().parents[1]
# Qwen2.5-0.5B's architecture (its config.json), random weights
QWEN25_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def build_model(out: Path) -> Path:
    """Save the random Qwen2.5-0.5B-shaped model and its synthetic tokenizer into `out`."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    if (out / "config.json").exists():
        return out
    chars = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, **{c: 3 + i for i, c in enumerate(chars)}}
    vocab.update({f"<t{i}>": i for i in range(len(vocab), QWEN25_05B["vocab_size"])})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                        eos_token="<eos>")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_05B, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def measure(args) -> dict:
    """One backend, in this process: the trainer's own per-step timings."""
    import torch

    from grpo_ablate.config.compose import compose
    from grpo_ablate.rundir.files import read_rows
    from grpo_ablate.train.grpo import train

    steps = args.warmup + args.steps
    overrides = [
        "model=hf", f"model.path={args.model_dir}", f"model.dtype={args.dtype}",
        "task=jsonl", f"task.path={REPO / 'tests' / 'data' / 'word_problems.jsonl'}", "task.eval_size=4",
        f"rollout={args.one}", f"rollout.prompts_per_step={args.prompts}", f"rollout.group_size={args.group}",
        f"rollout.max_new_tokens={args.max_new_tokens}", "eval.max_new_tokens=16",
        *( [f"rollout.gpu_memory_utilization={args.gpu_memory_utilization}"] if args.one == "vllm" else []),
        "kl=fixed" if args.beta > 0 else "kl=none", f"kl.beta={args.beta}", "optim.lr=1e-6",
        f"steps={steps}", "logger=none", f"eval.every={steps + 1}", f"checkpoint_every={steps + 1}",
        f"samples_every={steps + 1}",
    ]
    with tempfile.TemporaryDirectory(prefix="gpu-throughput-") as run_dir:
        result = train(compose(overrides), run_dir, overrides)
        if result.state != "completed":
            raise RuntimeError(f"run ended {result.state}: {result.reason}")
        rows = [r for r in read_rows(Path(run_dir) / "metrics.jsonl") if r["step"] > args.warmup]
    median = lambda key: statistics.median(r[key] for r in rows)
    return {"backend": args.one, "gpu": torch.cuda.get_device_name(), "steps": len(rows), "prompts": args.prompts,
            "group": args.group, "max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "beta": args.beta,
            "step_s": round(median("time/step_s"), 3), "sample_s": round(median("time/sample_s"), 3),
            "update_s": round(median("time/update_s"), 3),
            "completion_tokens": median("perf/completion_tokens"),
            "tokens_per_s": round(median("perf/completion_tokens") / median("time/step_s"), 1),
            "peak_gpu_mem_gb": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step (B)")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (G)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--beta", type=float, default=0.04, help="KL coefficient (0: no reference forward)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps (CUDA graphs, allocator)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35, help="vLLM's share of the GPU")
    parser.add_argument("--model-dir", type=Path, default=REPO / "runs" / "bench" / "qwen2.5-0.5b-random")
    parser.add_argument("--one", choices=["hf", "vllm"], help=argparse.SUPPRESS)   # internal: one backend
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args)), flush=True)
        return
    import torch

    if not torch.cuda.is_available():
        sys.exit("error: this benchmark needs a CUDA GPU (none is available here)")
    build_model(args.model_dir)
    forwarded = [a for a in sys.argv[1:] if a != "--backend" and a not in ("hf", "vllm")]
    for backend in args.backend:   # a fresh process per backend: vLLM keeps its GPU memory
        out = subprocess.run([sys.executable, __file__, "--one", backend, *forwarded], capture_output=True, text=True)
        line = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else None
        print(line or json.dumps({"backend": backend, "error": (out.stderr.strip().splitlines() or ["?"])[-1]}),
              flush=True)


if __name__ == "__main__":
    main()
