"""The training forward: per-token log-probs of a rollout's completion tokens under a model.

The same function scores the batch under the policy (with gradient, for the update), under
the frozen anchors (pi_ref, pi_old, pi_prev, without) and for the gradient diagnostics.
"""
from __future__ import annotations

import torch

from grpo_ablate.sampling.decode import Rollout, positions


def completion_logprobs(model, rollout: Rollout, temperature: float = 1.0,
                        entropy_grad: bool = False, return_hidden: bool = False):
    """Per-token log pi(o_t | q, o_<t) of the completion tokens and the per-token entropy.

    Log-probs come from logits / T as in TRL and verl, so the loss scores the distribution
    that was sampled. Only the last T + 1 positions go through the LM head. The entropy is
    over the full vocabulary and carries a gradient only when a trick needs it. With
    `return_hidden`, the matching last-layer hidden states come third (for a critic).
    """
    num_completion = rollout.completion_mask.shape[1]
    out = model(input_ids=rollout.sequences, attention_mask=rollout.attention_mask,
                position_ids=positions(rollout.attention_mask), use_cache=False,
                logits_to_keep=num_completion + 1, output_hidden_states=return_hidden)
    logits = out.logits[:, :-1, :].float() / temperature  # position t predicts completion token t
    log_probs = torch.log_softmax(logits, dim=-1)
    token_logp = log_probs.gather(-1, rollout.completion_ids.unsqueeze(-1)).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(log_probs.exp() * log_probs).sum(dim=-1)
    if return_hidden:  # the last layer's state before each completion token (for a value head)
        return token_logp, entropy, out.hidden_states[-1][:, -(num_completion + 1):-1].float()
    return token_logp, entropy


def token_logprobs(model, rollout: Rollout, temperature, value_head=None, entropy_grad: bool = False):
    """(log-probs [N, T], entropy [N, T], values [N, T] or None): a model's forward over the
    batch, and the critic's value of each completion token when there is a critic (a head on
    the policy's last layer)."""
    logp, entropy, *hidden = completion_logprobs(model, rollout, temperature, entropy_grad=entropy_grad,
                                                 return_hidden=value_head is not None)
    values = value_head(hidden[0]).squeeze(-1) if value_head is not None else None
    return logp, entropy, values
