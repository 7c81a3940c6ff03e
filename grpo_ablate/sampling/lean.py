"""A lean KV-cached decoder for Llama-family models (Qwen2, Llama, Mistral), for sampling.

Why: sampling tiny and small models is bound by per-token overhead, not arithmetic (W1
decodes 24 tokens for 64 sequences). This decoder runs the same math as the transformers
module with fewer, larger ops: q/k/v and gate/up projections fused into one matmul each,
a preallocated cache, attention as two batched matmuls. Training log-probs always come from
the transformers model itself, so any numerical difference here only changes which tokens
are sampled, never the loss; tests check it matches the transformers forward closely.

Only architectures whose structure is known to match are accepted (`supports`); anything
else samples with the model's own forward.
"""
from __future__ import annotations

import torch

SUPPORTED_MODEL_TYPES = ("qwen2", "llama", "mistral")


def supports(model) -> bool:
    return unsupported(model) is None


def unsupported(model) -> str | None:
    """What of `model` LeanDecoder does not implement, in words (None: it runs this model)."""
    if hasattr(model, "peft_config"):
        if (problem := _adapter_problem(model)) is not None:
            return problem
        model = model.get_base_model()
    cfg = model.config
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {cfg.model_type!r} (it knows {', '.join(SUPPORTED_MODEL_TYPES)})"
    if rope_type != "default":
        return f"rope_type {rope_type!r} (only the default rope)"
    if getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (only silu)"
    if not (hasattr(model, "model") and hasattr(model.model, "rotary_emb")):
        return "a model without model.rotary_emb"
    layer = model.model.layers[0]
    mlp = (layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)
    if _bias(layer.self_attn.o_proj) is not None or any(_bias(p) is not None for p in mlp):
        return "biases on the attention output or the MLP (attention_bias / mlp_bias of a Llama config)"
    return None


def _adapter_problem(peft_model) -> str | None:
    """What of a peft model's adapters LeanDecoder cannot merge into its weight snapshot."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    if any(str(getattr(c, "peft_type", "")).split(".")[-1] != "LORA" for c in peft_model.peft_config.values()):
        return "adapters other than LoRA"
    for module in peft_model.modules():
        if hasattr(module, "lora_A"):
            if not isinstance(module, LoraLinear) or getattr(module, "fan_in_fan_out", False):
                return f"LoRA on a {type(module).__name__} (it merges LoRA on Linear layers only)"
            if any(getattr(module, "use_dora", {}).values()):
                return "DoRA adapters"
    return None


def _weight(linear):
    """A Linear's weight with its active LoRA adapters added (a new tensor; the model is
    untouched): W + B A * scale, the same map the adapter computes as W x + B (A x) * scale
    (LoRA's dropout is off in eval mode, where the sampler runs)."""
    base = getattr(linear, "base_layer", None)
    if base is None:
        return linear.weight
    weight = base.weight
    if not linear.disable_adapters and not linear.merged:
        for name in linear.active_adapters:
            if name in linear.lora_A:
                weight = weight + linear.get_delta_weight(name)
    return weight


def _bias(linear):
    return getattr(linear, "base_layer", linear).bias


class LeanDecoder:
    """Weights snapshotted (fused) from `model` at construction: build one per rollout. With
    `dtype` (bf16: rollout.dtype) the snapshot and the cache are cast to it once, so the
    sampler runs in that precision while the model keeps its own."""

    def __init__(self, model, dtype: torch.dtype | None = None):
        if hasattr(model, "peft_config"):   # LoRA: each adapter merged into its weight's snapshot
            model = model.get_base_model()
        cfg = model.config
        core = model.model
        self.num_heads = cfg.num_attention_heads
        self.num_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.embed = core.embed_tokens.weight
        self.inv_freq = core.rotary_emb.inv_freq
        self.rope_scale = float(getattr(core.rotary_emb, "attention_scaling", 1.0))
        self.layers = []
        for layer in core.layers:
            att, mlp = layer.self_attn, layer.mlp
            projections = (att.q_proj, att.k_proj, att.v_proj)
            bias = (torch.cat([_bias(p) for p in projections]) if _bias(att.q_proj) is not None else None)
            self.layers.append((
                layer.input_layernorm.weight,
                torch.cat([_weight(p) for p in projections]).detach(),
                None if bias is None else bias.detach(),
                _weight(att.o_proj).detach(),
                layer.post_attention_layernorm.weight,
                torch.cat([_weight(mlp.gate_proj), _weight(mlp.up_proj)]).detach(),
                _weight(mlp.down_proj).detach(),
            ))
        self.final_norm = core.norm.weight
        self.lm_head = _weight(model.lm_head).detach()
        self.lm_head_bias = None if _bias(model.lm_head) is None else _bias(model.lm_head).detach()
        if dtype is not None:
            cast = lambda t: None if t is None else t.detach().to(dtype)
            self.embed, self.final_norm = cast(self.embed), cast(self.final_norm)
            self.lm_head, self.lm_head_bias = cast(self.lm_head), cast(self.lm_head_bias)
            self.layers = [tuple(cast(t) for t in layer) for layer in self.layers]

    def new_cache(self, batch: int, slots: int):
        shape = (len(self.layers), batch, self.num_kv, slots, self.head_dim)
        return torch.zeros(shape, dtype=self.embed.dtype), torch.zeros(shape, dtype=self.embed.dtype)

    def _rms(self, x, weight):
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, self.eps)

    @staticmethod
    def _rope(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    @torch.no_grad()
    def forward(self, input_ids, positions, cache_k, cache_v, start: int, key_bias):
        """Run `input_ids` [N, T] at cache slots start..start+T-1; returns last-position logits.

        `cache_k`, `cache_v` are [layers, N, kv_heads, slots, head_dim] (see `new_cache`).

        `key_bias` [N, 1, 1, S] is 0 where a cached key may be attended and -inf where not
        (left padding); causality inside the new block is added here.
        """
        n, t = input_ids.shape
        H, K, D = self.num_heads, self.num_kv, self.head_dim
        group = H // K
        freqs = positions[..., None].float() * self.inv_freq        # [N, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scale)[:, None].to(self.embed.dtype)   # [N, 1, T, D]
        sin = (emb.sin() * self.rope_scale)[:, None].to(self.embed.dtype)
        end = start + t
        bias = key_bias[..., :end]
        if t > 1:  # causal within the new block; every query may see itself, so a left-pad
            # query never has all keys masked (which would put NaN into its values)
            causal = torch.full((t, end), float("-inf"), dtype=bias.dtype).triu(start + 1)
            bias = (bias + causal).clone()
            rows = torch.arange(t)
            bias[..., rows, start + rows] = 0.0
        h = self.embed[input_ids]
        for layer_k, layer_v, (w_in, w_qkv, b_qkv, w_o, w_post, w_gu, w_down) in zip(cache_k, cache_v, self.layers):
            x = self._rms(h, w_in)
            qkv = torch.nn.functional.linear(x, w_qkv, b_qkv)
            qk, v = qkv.split(((H + K) * D, K * D), dim=-1)
            qk = self._rope(qk.view(n, t, H + K, D).transpose(1, 2), cos, sin)  # rope q and k at once
            q, k = qk.split((H, K), dim=1)                                   # [N, H|K, T, D]
            layer_k[:, :, start:end] = k
            layer_v[:, :, start:end] = v.view(n, t, K, D).transpose(1, 2)
            q = q.reshape(n, K, group * t, D)                                # heads sharing a kv head
            scores = q @ layer_k[:, :, :end].transpose(-1, -2) * D ** -0.5    # [N, K, G*T, S]
            scores = scores.view(n, K, group, t, end) + bias[:, :, None]
            attn = torch.softmax(scores.float(), dim=-1).to(q.dtype).view(n, K, group * t, end)
            out = (attn @ layer_v[:, :, :end]).view(n, H, t, D).transpose(1, 2).reshape(n, t, H * D)
            h = h + torch.nn.functional.linear(out, w_o)
            gate, up = torch.nn.functional.linear(self._rms(h, w_post), w_gu).chunk(2, dim=-1)
            h = h + torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, w_down)
        return torch.nn.functional.linear(self._rms(h[:, -1], self.final_norm), self.lm_head, self.lm_head_bias)
