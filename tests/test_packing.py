"""model.remove_padding: the training forward on packed sequences equals the padded forward."""
import pytest
import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from grpo_ablate.sampling.decode import Rollout
from grpo_ablate.train.forward import PACKABLE_MODEL_TYPES, best_fit_rows, completion_logprobs, pack, packs

SHAPE = dict(vocab_size=20, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False)
ARCHS = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM),
         "llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM)}


def model_of(arch: str, attn: str):
    torch.manual_seed(0)
    config_cls, model_cls = ARCHS[arch]
    return model_cls(config_cls(**SHAPE, attn_implementation=attn)).train()


def ragged_rollout(n=12, prompt_width=5, completion_width=9, seed=0) -> Rollout:
    """Left-padded prompts of 1..prompt_width tokens, completions of 1..completion_width."""
    g = torch.Generator().manual_seed(seed)
    sequences = torch.randint(3, 20, (n, prompt_width + completion_width), generator=g)
    attention = torch.zeros_like(sequences)
    completion_mask = torch.zeros(n, completion_width)
    for i in range(n):
        p = int(torch.randint(1, prompt_width + 1, (1,), generator=g))
        c = int(torch.randint(1, completion_width + 1, (1,), generator=g))
        attention[i, prompt_width - p:prompt_width + c] = 1
        completion_mask[i, :c] = 1
    sequences = sequences * attention     # pad id 0 off the real tokens
    return Rollout(sequences, attention, prompt_width, completion_mask, completion_mask[:, -1] == 1)


def test_every_packable_architecture_is_tested_here():
    assert set(PACKABLE_MODEL_TYPES) == set(ARCHS)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_packed_forward_and_gradients_equal_padded(arch, attn):
    model = model_of(arch, attn)
    roll = ragged_rollout()
    assert packs(model) and pack(roll) is not None and pack(roll).input_ids.shape[0] < 12   # it does pack
    mask = roll.completion_mask.bool()
    results = []
    for remove_padding in (False, True):
        model.zero_grad()
        logp, entropy, hidden = completion_logprobs(model, roll, temperature=0.7, entropy_grad=True,
                                                    return_hidden=True, remove_padding=remove_padding)
        ((logp + entropy) * mask).sum().backward()   # masked tokens carry nothing, as in every loss
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((logp[mask], entropy[mask], hidden[mask], grads))
    (*padded, padded_grad), (*packed, packed_grad) = results
    for a, b in zip(packed, padded):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the weight gradients sum the same terms in another order: equal up to float32 rounding
    assert (packed_grad - padded_grad).norm() <= 1e-5 * padded_grad.norm()


def test_value_head_hidden_states_and_temperature_follow_the_packing():
    """Each completion token's hidden state is its own sequence's, at the position before it."""
    model = model_of("qwen2", "eager").eval()
    roll = ragged_rollout(seed=3)
    _, _, hidden = completion_logprobs(model, roll, return_hidden=True, remove_padding=True)
    i = int(roll.completion_mask.sum(1).argmax())                    # a long one, alone in the forward
    real = roll.attention_mask[i].bool()
    alone = model(input_ids=roll.sequences[i, real][None], output_hidden_states=True).hidden_states[-1][0]
    p = int(real[:roll.prompt_len].sum())
    c = int(roll.completion_mask[i].sum())
    torch.testing.assert_close(hidden[i, :c], alone[p - 1:p - 1 + c], rtol=1e-5, atol=1e-6)


def test_best_fit_rows_fill_rows_without_overlap():
    lengths = [7, 3, 5, 2, 4, 1, 6, 2]
    row, offset = best_fit_rows(lengths, 8)
    assert (row, offset) == best_fit_rows(lengths, 8)                  # deterministic
    assert max(row) + 1 == 4                                           # 30 tokens in rows of 8: 4 rows
    for r in set(row):
        spans = sorted((offset[i], offset[i] + lengths[i]) for i in range(len(lengths)) if row[i] == r)
        assert spans[-1][1] <= 8 and all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def test_pack_declines_what_it_cannot_improve_or_read():
    full = Rollout(torch.ones(4, 6, dtype=torch.long), torch.ones(4, 6, dtype=torch.long), 3,
                   torch.ones(4, 3), torch.ones(4, dtype=torch.bool))
    assert pack(full) is None                                          # no padding: nothing to pack
    holes = ragged_rollout()
    holes.attention_mask[0] = torch.tensor([1, 0] * 7)                 # not one run of real tokens
    assert pack(holes) is None


def test_models_that_cannot_take_packed_rows_run_padded():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=20, n_embd=32, n_layer=1, n_head=2, n_positions=64))
    assert not packs(gpt2)
    flash = model_of("qwen2", "eager")
    flash.config._attn_implementation = "flash_attention_2"
    assert not packs(flash)



def test_a_lora_policy_and_its_adapter_free_reference_pack_alike():
    from peft import LoraConfig, get_peft_model

    from grpo_ablate.models import AdapterDisabled
    policy = get_peft_model(model_of("qwen2", "eager"), LoraConfig(r=4, target_modules="all-linear"))
    assert packs(policy) and packs(AdapterDisabled(policy))   # pi and pi_ref: one forward, KL exactly 0 at the start


def test_a_ddp_wrapped_model_packs_as_the_model_it_wraps():
    class Wrapped(torch.nn.Module):   # DistributedDataParallel keeps the model in .module
        def __init__(self, module):
            super().__init__()
            self.module = module
    assert packs(Wrapped(model_of("llama", "sdpa")))
