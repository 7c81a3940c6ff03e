"""Benchmark workload W1's fixed inputs: the tokenizer, the random model, the prompts, the reward.

Specified in /work/shared/bench/W1.md. Both sides of the comparison (grpo-ablate and TRL) load
the model and tokenizer by path from the directory `build_assets` writes, so they start from
byte-identical weights, and both walk the same prompt stream in the same order.
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

# W1 constants (W1.md, "Tokenizer", "Model", "Prompts", "Step").
W1_CHARS = "0123456789+= "
W1_N_PARAMS = 987_264
W1_PROMPTS_PER_STEP = 8
W1_SEED = 0

# Files save_pretrained writes that W1 needs back; their presence means "already built".
_ASSET_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _build_model_and_tokenizer():
    """Build W1's tokenizer and random float32 Qwen2 model, exactly as W1.md specifies."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_ablate.models import build_char_tokenizer

    tokenizer = build_char_tokenizer(W1_CHARS)
    # `<pad>`=0, `<bos>`=1, `<eos>`=2, '0'..'9'=3..12, '+'=13, '='=14, ' '=15
    assert len(tokenizer) == 16, len(tokenizer)
    assert tokenizer("12+34=")["input_ids"] == [4, 5, 13, 6, 7, 14], "tokenizer is not W1's"

    config = Qwen2Config(
        vocab_size=16,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(W1_SEED)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    n_params = sum(p.numel() for p in model.parameters())  # tied embedding counted once
    if n_params != W1_N_PARAMS:
        raise RuntimeError(f"W1 model has {n_params:,} parameters, expected {W1_N_PARAMS:,}")
    return model, tokenizer


def build_assets(out_dir: str) -> str:
    """Save W1's tokenizer and model into `out_dir` (reused if already there); return its path.

    The directory is written to a temporary sibling and renamed into place, so a crash or two
    concurrent builders never leave a half-written directory that later looks "already built".
    """
    out = Path(out_dir).resolve()
    if all((out / name).is_file() for name in _ASSET_FILES):
        return str(out)

    out.parent.mkdir(parents=True, exist_ok=True)
    model, tokenizer = _build_model_and_tokenizer()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it owner-only
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # an empty directory (e.g. made by hand) is replaced
        try:
            os.replace(tmp, out)
        except OSError:
            # Another process finished first (its copy is identical), or `out` is a non-empty
            # directory that is not W1's assets: never delete that, say so.
            if not all((out / name).is_file() for name in _ASSET_FILES):
                raise RuntimeError(
                    f"{out} exists and does not hold W1's assets; pass an empty or new directory"
                ) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(out)


def load_w1_tokenizer(assets_dir: str):
    """Load W1's tokenizer back from `assets_dir`, exactly as it was built.

    Not `AutoTokenizer`: in transformers 5.x, AutoTokenizer sees `model_type: qwen2` in the
    directory's config.json and returns a `Qwen2Tokenizer`, which replaces the saved
    pre-tokenizer with Qwen's byte-level regex (and adds an NFC normalizer and a ByteLevel
    decoder): digits, '+' and '=' still map to the same ids, but ' ' (id 15) is silently lost.
    `PreTrainedTokenizerFast` loads tokenizer.json as saved.
    """
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(assets_dir)
    assert tokenizer("1 2")["input_ids"] == [4, 15, 5], "not W1's tokenizer"
    return tokenizer


def w1_prompts(step: int) -> list[tuple[str, int]]:
    """The 8 (prompt, answer) pairs of optimizer step `step` (0-based): prompts 8k..8k+7.

    The stream is `rng = random.Random(0)`, and each prompt draws a then b from randint(10, 99);
    it is regenerated from the start on every call so that any step can be asked for alone.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    rng = random.Random(W1_SEED)
    pairs = []
    for _ in range((step + 1) * W1_PROMPTS_PER_STEP):
        a = rng.randint(10, 99)
        b = rng.randint(10, 99)
        pairs.append((f"{a}+{b}=", a + b))
    return pairs[-W1_PROMPTS_PER_STEP:]


def w1_reward(completion_text: str, answer: int) -> float:
    """1.0 iff the completion, cut at the first `<eos>` and stripped, equals str(answer)."""
    return 1.0 if completion_text.split("<eos>", 1)[0].strip() == str(answer) else 0.0


if __name__ == "__main__":
    import sys

    print(build_assets(sys.argv[1] if len(sys.argv) > 1 else "runs/bench/w1_assets"))
