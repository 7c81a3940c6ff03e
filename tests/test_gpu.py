"""The GPU path on a real GPU (marked `gpu`: skipped without CUDA, with the reason; run them
with scripts/gpu_check.sh on a GPU machine). CPU CI covers the same code against stand-ins
(test_vllm_rollout.py); these check what only a GPU shows: bf16 autocast and flash attention
on CUDA kernels, and real vLLM rollouts whose weights follow the policy."""
import importlib.util
import math

import pytest
import torch

from grpo_ablate.config.compose import compose
from grpo_ablate.rundir.files import read_rows
from grpo_ablate.train.grpo import train
from test_real_models import MOVES, hf_run

pytestmark = pytest.mark.gpu


def run(overrides, run_dir):
    result = train(compose(overrides), run_dir, overrides)
    assert result.state == "completed", result.reason
    return read_rows(run_dir / "metrics.jsonl")


def finite_rows(rows):
    return all(math.isfinite(v) for row in rows for v in row.values() if isinstance(v, float))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_autocast_training_on_cuda(tiny_models, tmp_path, dtype):
    """model.dtype=bfloat16|float16 on CUDA: 2 steps, finite metrics; float16 with its loss scale."""
    rows = run(hf_run(tiny_models["qwen2"], *MOVES, "model.device=cuda", f"model.dtype={dtype}"), tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2] and finite_rows(rows)
    assert torch.cuda.max_memory_allocated() > 0


def test_flash_attention_matches_sdpa(tiny_models, tmp_path):
    """flash_attention_2 where installed: the same first-step log-probs as sdpa, to bf16 rounding."""
    if importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash_attn is not installed")
    base = hf_run(tiny_models["qwen2"], *MOVES, "model.device=cuda", "model.dtype=bfloat16", "steps=1")
    sdpa = run(base + ["model.attn_implementation=sdpa"], tmp_path / "sdpa")
    flash = run(base + ["model.attn_implementation=flash_attention_2"], tmp_path / "flash")
    assert flash[1]["loss"] == pytest.approx(sdpa[1]["loss"], rel=5e-2, abs=5e-3)


def test_vllm_rollouts_follow_the_policy(tiny_models, tmp_path):
    """rollout=vllm for real: the trainer's recomputed log-probs stay close to vLLM's own at every
    step, which holds only if the weights pushed after each optimizer step arrived."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    rows = run(hf_run(tiny_models["qwen2"], *MOVES, "rollout=vllm", "model.device=cuda", "model.dtype=bfloat16",
                      "steps=3", "rollout.gpu_memory_utilization=0.2"), tmp_path / "run")
    steps = [r for r in rows if "rollout/logprob_gap_mean" in r]
    assert len(steps) == 3 and finite_rows(rows)
    assert all(r["rollout/logprob_gap_mean"] < 0.05 for r in steps), [r["rollout/logprob_gap_mean"] for r in steps]
