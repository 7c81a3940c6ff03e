"""lm_head=fp32: under bf16 autocast the head and its logits are float32, closer to
the float32 model's than the bf16 head's are (TRL cast_lm_head_to_fp32)."""
import copy

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpo_ablate.models import autocast_forward
from grpo_ablate.tricks import option


def tiny_model():
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).eval()


def test_fp32_head_gives_float32_logits_under_bf16_autocast():
    model = tiny_model()
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = model(ids).logits
        bf16 = autocast_forward(copy.deepcopy(model), "bfloat16")
        fp32_head = option("lm_head", "fp32").impl(autocast_forward(copy.deepcopy(model), "bfloat16"))
        low, high = bf16(ids).logits, fp32_head(ids).logits
    assert low.dtype == torch.bfloat16 and high.dtype == torch.float32
    assert (high - exact).abs().max() < (low.float() - exact).abs().max()
    # the head itself is exact: the same float32 matmul on the (bf16-computed) hidden states
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = fp32_head.model(ids).last_hidden_state
    torch.testing.assert_close(high, hidden.float() @ model.lm_head.weight.T)
    # a deepcopy (the reference policy) keeps the float32 head, on its own weights
    with torch.no_grad():
        assert copy.deepcopy(fp32_head)(ids).logits.dtype == torch.float32


def test_compute_leaves_the_model_alone():
    model = tiny_model()
    assert option("lm_head", "compute").impl(model) is model and "forward" not in vars(model.lm_head)
