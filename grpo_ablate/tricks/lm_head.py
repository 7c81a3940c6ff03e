"""Family `lm_head`: the precision of the LM head and its logits under mixed-precision training.

With model.dtype=bfloat16 (or float16) the forward runs under torch.autocast: every matmul,
the LM head's included, runs in the low dtype, so the logits -- and the log-probs, the ratio
and the KL computed from them -- carry bf16's 8-bit mantissa (a relative error ~4e-3, i.e. an
absolute error of a few hundredths on a logit of 10). Every option takes the model (after
`autocast_forward`) and returns it:

    compute   the head in the compute dtype (the trainer's path without the family: untouched)
    fp32      the head's matmul outside autocast, on float32 hidden states and float32 weights:
              float32 logits (TRL `cast_lm_head_to_fp32`, prime-rl `enable_fp32_lm_head`,
              ROLL `logits_in_fp32`; ScaleRL reports the asymptote 0.52 -> 0.61, arXiv 2510.13786)

Reference: TRL grpo_trainer (cast_lm_head_to_fp32: the head's weight cast to float32 and a
forward hook casting its input); here the weights are float32 already (autocast keeps the
master copy), so only autocast is switched off around the head. Differences: TRL and
prime-rl hold the rest of the model in bf16 weights; here the body's weights stay float32
and only its compute is bf16 (autocast). The sampler is unaffected (rollout.dtype decides it).
"""
from __future__ import annotations

import types

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import Claim, Inert, Trick, declare_family, register

declare_family("lm_head", "the LM head's precision under model.dtype=bfloat16 or float16: `fp32` computes the head "
               "and the logits in float32 (TRL cast_lm_head_to_fp32, prime-rl, ROLL logits_in_fp32)",
               stage="model", default="compute")


def _full_precision_model(cfg) -> bool:
    return str(cfg.model.get("dtype") or "float32") == "float32"


@register("lm_head", "compute",
          what="the LM head in the compute dtype (model.dtype)")
def head_in_compute_dtype(model):
    return model


@register("lm_head", "fp32",
          what="the LM head and its logits in float32 under bf16/fp16 training (TRL cast_lm_head_to_fp32)",
          inert=Inert(_full_precision_model, "cannot act with model.dtype=float32: the head is float32 already",
                      "train with model.dtype=bfloat16 (+model.dtype=bfloat16 on the tiny default)",
                      "model.dtype=bfloat16 or float16"),
          tricks=(Trick("fp32_lm_head",
                        what="the LM head and logits in float32 under bf16 training",
                        source="TRL cast_lm_head_to_fp32; prime-rl enable_fp32_lm_head; ROLL logits_in_fp32 "
                               "(ScaleRL, arXiv 2510.13786)",
                        verdict="not_in_review",
                        claims=(Claim("helps", "", "ScaleRL (arXiv 2510.13786)",
                                      "FP32 logits raise the fitted asymptote A from 0.52 to 0.61"),)),))
def head_in_float32(model):
    """The output embedding's forward without autocast, in float32 (its weights are float32)."""
    head = model.get_output_embeddings()

    def forward(self, hidden):
        with torch.autocast(hidden.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return torch.nn.functional.linear(hidden.float(), self.weight.float(), bias)

    head.forward = types.MethodType(forward, head)
    return model
