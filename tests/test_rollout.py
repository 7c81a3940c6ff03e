"""Sampling: masks, truncation, left padding and the KV cache against a full forward."""
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from grpo_ablate.sampling import lean as lean_decode

from grpo_ablate.models import build_char_tokenizer
from grpo_ablate.sampling.decode import decode_completions, generate, left_pad
from grpo_ablate.train.forward import completion_logprobs

TOK = build_char_tokenizer("0123456789+=,;")


def tiny_model(seed=0):
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(TOK), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      tie_word_embeddings=False, pad_token_id=0, eos_token_id=2)
    return Qwen2ForCausalLM(cfg).eval()


LEAN = pytest.mark.parametrize("lean", [True, False], ids=["lean", "hf"])
PROMPTS = [TOK(p).input_ids for p in ["1+2=", "47+59=", "123+4="]]


def test_left_pad():
    ids, mask = left_pad([[5, 6], [7]], pad_id=0)
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]


@LEAN
def test_eos_always_gives_length_one_and_no_truncation(lean):
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(len(TOK)))
        model.lm_head.bias[TOK.eos_token_id] = 1e4
    roll = generate(model, PROMPTS, num_samples=2, max_new_tokens=8, temperature=1.0,
                    eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id, generator=torch.Generator().manual_seed(0),
                    lean=lean)
    assert roll.lengths.tolist() == [1.0] * 6          # the EOS itself is a trained token
    assert not roll.truncated.any()
    assert roll.completion_ids.shape[1] == 1            # decoding stopped once all rows ended
    assert decode_completions(TOK, roll) == [""] * 6


@LEAN
def test_no_eos_within_budget_is_truncated(lean):
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(len(TOK)))
        model.lm_head.bias[TOK.eos_token_id] = -1e4
    roll = generate(model, PROMPTS, num_samples=1, max_new_tokens=5, temperature=1.0,
                    eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id, generator=torch.Generator().manual_seed(0),
                    lean=lean)
    assert roll.truncated.all() and roll.lengths.tolist() == [5.0] * 3


@LEAN
def test_mask_covers_tokens_up_to_and_including_eos(lean):
    model = tiny_model(3)
    roll = generate(model, PROMPTS, num_samples=4, max_new_tokens=12, temperature=1.0,
                    eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id, generator=torch.Generator().manual_seed(1),
                    lean=lean)
    for ids, mask, truncated in zip(roll.completion_ids, roll.completion_mask, roll.truncated):
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()               # a prefix
        assert (ids[n:] == TOK.pad_token_id).all()                  # pad after the end
        assert bool(truncated) == (TOK.eos_token_id not in ids[:n].tolist())
        if not truncated:
            assert ids[n - 1] == TOK.eos_token_id


@LEAN
def test_cached_sampling_matches_a_full_forward(lean):
    """Greedy tokens from the KV-cached, left-padded loop are the argmax of one full forward,
    and the training log-probs are that forward's log-softmax at the sampled tokens."""
    model = tiny_model(1)
    roll = generate(model, PROMPTS, num_samples=1, max_new_tokens=10, temperature=0.0,
                    eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id, lean=lean)
    with torch.no_grad():
        logp, entropy = completion_logprobs(model, roll, temperature=1.0)
    for row, prompt in enumerate(PROMPTS):
        n = int(roll.lengths[row])
        seq = torch.tensor([prompt + roll.completion_ids[row, :n].tolist()])
        with torch.no_grad():
            full = torch.log_softmax(model(seq).logits[0, len(prompt) - 1:-1], dim=-1)  # no padding at all
        assert full.argmax(-1).tolist() == roll.completion_ids[row, :n].tolist()
        expected = full.gather(-1, roll.completion_ids[row, :n, None]).squeeze(-1)
        torch.testing.assert_close(logp[row, :n], expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(entropy[row, :n], -(full.exp() * full).sum(-1), atol=1e-5, rtol=1e-5)


def test_temperature_scales_training_logprobs():
    model = tiny_model(2)
    roll = generate(model, PROMPTS, num_samples=1, max_new_tokens=4, temperature=0.0,
                    eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id)
    with torch.no_grad():
        hot, _ = completion_logprobs(model, roll, temperature=2.0)
        out = model(input_ids=roll.sequences, attention_mask=roll.attention_mask,
                    position_ids=(roll.attention_mask.cumsum(1) - 1).clamp(min=0))
    logits = out.logits[:, roll.prompt_len - 1:-1] / 2.0
    expected = torch.log_softmax(logits, -1).gather(-1, roll.completion_ids[..., None]).squeeze(-1)
    mask = roll.completion_mask.bool()
    torch.testing.assert_close(hot[mask], expected[mask], atol=1e-5, rtol=1e-5)


@LEAN
def test_sampling_is_reproducible_with_the_same_generator(lean):
    model = tiny_model(4)
    kwargs = dict(num_samples=3, max_new_tokens=8, temperature=1.0, eos_id=TOK.eos_token_id,
                  pad_id=TOK.pad_token_id, lean=lean)
    a = generate(model, PROMPTS, generator=torch.Generator().manual_seed(7), **kwargs)
    b = generate(model, PROMPTS, generator=torch.Generator().manual_seed(7), **kwargs)
    assert torch.equal(a.sequences, b.sequences)


@pytest.mark.parametrize("make", [
    lambda: tiny_model(5),                                        # Qwen2: q/k/v biases, GQA
    lambda: LlamaForCausalLM(LlamaConfig(vocab_size=len(TOK), hidden_size=32, intermediate_size=48,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                         max_position_embeddings=64, pad_token_id=0, eos_token_id=2)).eval(),
], ids=["qwen2", "llama"])
def test_lean_decoder_matches_the_transformers_forward(make):
    torch.manual_seed(0)
    model = make()
    assert lean_decode.supports(model)
    kwargs = dict(num_samples=2, max_new_tokens=12, temperature=0.0, eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id)
    lean = generate(model, PROMPTS, lean=True, **kwargs)
    hf = generate(model, PROMPTS, lean=False, **kwargs)
    assert torch.equal(lean.sequences, hf.sequences) and torch.equal(lean.completion_mask, hf.completion_mask)
    # and the logits themselves, step by step, on a left-padded batch
    decoder = lean_decode.LeanDecoder(model)
    ids, mask = left_pad(PROMPTS, TOK.pad_token_id)
    cache_k, cache_v = decoder.new_cache(len(PROMPTS), ids.shape[1] + 1)
    bias = torch.where(mask.bool(), 0.0, float("-inf"))[:, None, None, :]
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    first = decoder.forward(ids, pos, cache_k, cache_v, 0, bias)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
    torch.testing.assert_close(first, expected, atol=1e-5, rtol=1e-5)
    nxt = first.argmax(-1, keepdim=True)
    mask2 = torch.cat([mask, torch.ones_like(nxt)], 1)
    bias2 = torch.where(mask2.bool(), 0.0, float("-inf"))[:, None, None, :]
    second = decoder.forward(nxt, pos[:, -1:] + 1, cache_k, cache_v, ids.shape[1], bias2)
    with torch.no_grad():
        expected2 = model(input_ids=torch.cat([ids, nxt], 1), attention_mask=mask2,
                          position_ids=(mask2.cumsum(1) - 1).clamp(min=0)).logits[:, -1]
    torch.testing.assert_close(second, expected2, atol=1e-5, rtol=1e-5)


def test_unsupported_architectures_fall_back_to_the_model_forward():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(TOK), n_embd=32, n_layer=1, n_head=2, n_positions=64,
                                       pad_token_id=0, eos_token_id=2)).eval()
    assert not lean_decode.supports(model)
    roll = generate(model, PROMPTS, num_samples=2, max_new_tokens=6, temperature=0.0,
                    eos_id=TOK.eos_token_id, pad_id=TOK.pad_token_id, lean=True)
    assert roll.sequences.shape[0] == 6


@LEAN
@pytest.mark.parametrize("per_row", [False, True], ids=["stream", "per_row"])
def test_sampler_logprobs_are_the_sampled_distributions_log_softmax(lean, per_row):
    """rollout=hf records log_softmax(logits / T) at each sampled token (what vLLM reports):
    in float32 it matches the trainer's own recomputation up to the KV cache's rounding."""
    from grpo_ablate.sampling.decode import RowNoise

    model = tiny_model(6)
    noise = RowNoise(seed=11, first=0, total=9) if per_row else None
    roll = generate(model, PROMPTS, num_samples=3, max_new_tokens=10, temperature=0.7, eos_id=TOK.eos_token_id,
                    pad_id=TOK.pad_token_id, generator=torch.Generator().manual_seed(3), lean=lean, noise=noise)
    with torch.no_grad():
        trainer_logp, _ = completion_logprobs(model, roll, temperature=0.7)
    mask = roll.completion_mask.bool()
    assert roll.sampler_logprobs.shape == mask.shape
    torch.testing.assert_close(roll.sampler_logprobs[mask], trainer_logp[mask], atol=1e-5, rtol=1e-5)
    assert torch.all(roll.sampler_logprobs[~mask] == 0) and torch.all(roll.sampler_logprobs[mask] < 0)
    greedy = generate(model, PROMPTS, num_samples=1, max_new_tokens=4, temperature=0.0, eos_id=TOK.eos_token_id,
                      pad_id=TOK.pad_token_id, lean=lean)
    assert greedy.sampler_logprobs is None                  # nothing sampled, nothing to correct


@LEAN
def test_bfloat16_sampler_is_a_real_mismatch_and_float32_changes_nothing(lean):
    model = tiny_model(7)
    kwargs = dict(num_samples=4, max_new_tokens=10, temperature=1.0, eos_id=TOK.eos_token_id,
                  pad_id=TOK.pad_token_id, lean=lean)
    fp32 = generate(model, PROMPTS, generator=torch.Generator().manual_seed(5), **kwargs)
    default = generate(model, PROMPTS, generator=torch.Generator().manual_seed(5), dtype="float32", **kwargs)
    assert torch.equal(fp32.sequences, default.sequences)
    assert torch.equal(fp32.sampler_logprobs, default.sampler_logprobs)
    bf16 = generate(model, PROMPTS, generator=torch.Generator().manual_seed(5), dtype="bfloat16", **kwargs)
    assert all(p.dtype == torch.float32 for p in model.parameters())       # training stays float32
    with torch.no_grad():
        trainer_logp, _ = completion_logprobs(model, bf16, temperature=1.0)
    mask = bf16.completion_mask.bool()
    gap = (bf16.sampler_logprobs - trainer_logp)[mask].abs()
    assert 1e-4 < gap.max() < 0.5                                            # real, but small
