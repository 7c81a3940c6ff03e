"""Tiny random causal LMs of three architectures, saved like real checkpoints (the `tiny_models`
fixture in conftest.py): hidden size 32, 2 layers, a character tokenizer over printable ASCII."""
import string

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from grpo_ablate.models import build_char_tokenizer

# Printable ASCII (and newline): enough for word problems, chat markup and \boxed{}.
CHARS = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")
# A chat template of our own (the Qwen2 model gets it; the others have none).
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _configs(vocab: int) -> dict:
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    small = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512, **ids)
    return {
        "llama": (LlamaForCausalLM, LlamaConfig(**small)),
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(**small, tie_word_embeddings=True)),
        "gpt2": (GPT2LMHeadModel, GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=2, n_positions=512,
                                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids)),
    }


def save_tiny_models(root) -> dict:
    """arch -> directory of a randomly initialised model and a character tokenizer."""
    paths = {}
    for arch, (cls, config) in _configs(len(build_char_tokenizer(CHARS))).items():
        torch.manual_seed(0)
        cls(config).save_pretrained(root / arch)
        tokenizer = build_char_tokenizer(CHARS)
        if arch == "qwen2":
            tokenizer.chat_template = CHAT_TEMPLATE
        tokenizer.save_pretrained(root / arch)
        paths[arch] = root / arch
    return paths
