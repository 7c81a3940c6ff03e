"""The training forward: per-token log-probs of a rollout's completion tokens under a model.

The same function scores the batch under the policy (with gradient, for the update), under
the frozen anchors (pi_ref, pi_old, pi_prev, without) and for the gradient diagnostics.

Padding removed (model.remove_padding, verl's `use_remove_padding`): a rollout is a padded
rectangle (prompts left-padded to the longest, completions right-padded to the longest), and
half of it can be padding -- completions that stop early are the rule. The forward instead
runs on the sequences laid end to end in as few rows as hold them; position ids restart at 0
where a sequence starts, from which transformers builds a block-diagonal causal mask, so no
token sees another sequence's. Same math per token (tested against the padded forward for
every architecture in PACKABLE_MODEL_TYPES); fewer tokens through every layer.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from grpo_ablate.sampling.decode import Rollout, positions
from grpo_ablate.sampling.filters import replay_mask
from grpo_ablate.tricks.clip.local import centred_logprob, old_topk_support

# architectures whose transformers forward builds its attention mask from packed position ids
# (create_causal_mask(position_ids=...)), each tested packed == padded; others run padded
PACKABLE_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")
# attention kernels that take the block-diagonal mask (flash-attention's varlen path needs one
# row; not tested here without a GPU, so it runs padded)
PACKABLE_ATTENTION = ("eager", "sdpa")


@dataclass
class Packing:
    """Where each sequence of a rollout sits when the sequences are laid end to end."""
    input_ids: torch.Tensor     # [B, W] the sequences' real tokens, back to back, then filler
    position_ids: torch.Tensor  # [B, W] 0, 1, ... within each sequence; 0 on every filler token
    keep: torch.Tensor          # [K] the columns whose logits some completion token needs
    logit_index: torch.Tensor   # [N, T] flat index into [B * K] of the logits predicting token t
    hidden_index: torch.Tensor  # [N, T] flat index into [B * W] of the same positions


def packs(model) -> bool:
    """Whether this model's forward may take packed rows (see PACKABLE_MODEL_TYPES)."""
    config = getattr(getattr(model, "module", model), "config", None)   # DDP wraps the model in .module
    return (config is not None and config.model_type in PACKABLE_MODEL_TYPES
            and getattr(config, "_attn_implementation", None) in PACKABLE_ATTENTION)


def best_fit_rows(lengths: list[int], width: int) -> tuple[list[int], list[int]]:
    """(row, offset) of each sequence: best-fit decreasing bin packing into rows of `width`
    tokens (longest first, each into the row it fills most tightly). Deterministic."""
    row, offset = [0] * len(lengths), [0] * len(lengths)
    space_left, rows = [], 0          # sorted (tokens still free, row) of rows with room
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        k = bisect.bisect_left(space_left, (lengths[i], -1))
        if k < len(space_left):
            space, row[i] = space_left.pop(k)
        else:
            space, row[i], rows = width, rows, rows + 1
        offset[i] = width - space
        if space > lengths[i]:
            bisect.insort(space_left, (space - lengths[i], row[i]))
    return row, offset


def pack(rollout: Rollout) -> Packing | None:
    """The packed layout of a rollout, or None when packing saves no row (or the real tokens
    of some row are not one contiguous run, which a Rollout never has)."""
    mask = rollout.attention_mask.bool()
    n, width_padded = mask.shape
    lengths = mask.sum(dim=1)
    first = mask.int().argmax(dim=1)                                    # first real column of each row
    cols = torch.arange(width_padded, device=mask.device)
    if not torch.equal((cols >= first[:, None]) & (cols < (first + lengths)[:, None]), mask):
        return None
    width = int(lengths.max())
    row, offset = best_fit_rows(lengths.tolist(), width)
    rows = max(row) + 1
    if rows == n:
        return None
    row = torch.tensor(row, device=mask.device)
    offset = torch.tensor(offset, device=mask.device)
    dest = (row * width + offset - first)[:, None] + cols                 # [N, S] flat packed position of each column
    input_ids = torch.zeros(rows * width, dtype=rollout.sequences.dtype, device=mask.device)
    position_ids = torch.zeros(rows * width, dtype=torch.long, device=mask.device)
    input_ids[dest[mask]] = rollout.sequences[mask]
    position_ids[dest[mask]] = positions(rollout.attention_mask)[mask]
    # completion token t is predicted at the column before it; a padding slot (t past the row's
    # end) reads the last prompt token's logits, masked out by every consumer
    P, T = rollout.prompt_len, rollout.completion_mask.shape[1]
    t = torch.arange(T, device=mask.device)
    real = t < mask[:, P:].sum(dim=1, keepdim=True)
    need = dest.gather(1, torch.where(real, P - 1 + t, torch.full_like(t, P - 1)))   # [N, T]
    keep = torch.unique(need % width)
    logit_index = (need // width) * len(keep) + torch.searchsorted(keep, need % width)
    return Packing(input_ids.view(rows, width), position_ids.view(rows, width), keep, logit_index, need)


def completion_logprobs(model, rollout: Rollout, temperature: float = 1.0,
                        entropy_grad: bool = False, return_hidden: bool = False, remove_padding: bool = True,
                        return_energy: bool = False, score_kept_sets: bool = True, return_kept_mass: bool = False,
                        topk: int = 0, support: tuple | None = None, return_head: bool = False):
    """Per-token log pi(o_t | q, o_<t) of the completion tokens and the per-token entropy.

    Log-probs come from logits / T as in TRL and verl, so the loss scores the distribution
    that was sampled. Only the positions that predict a completion token go through the LM
    head. The entropy is over the full vocabulary and carries a gradient only when a trick
    needs it. With `return_hidden`, the matching last-layer hidden states come third (for a
    critic). `remove_padding`: run the packed rows (module docstring) where the model allows.
    With `return_energy`, the last is each token's logit-gradient energy (no gradient):
    ||d log pi(o_t) / d logits||^2 = ||e_{o_t} - pi||^2 = 1 - 2 pi(o_t) + sum_v pi_v^2, verl's
    `sum_pi_squared` (exp(logsumexp(2 z) - 2 logsumexp(z)) of the logits z / T) put together
    with the sampled token's probability (adv=optimal_token_baseline reads it).
    A rollout from a filtering sampler carries each token's kept set (`kept_ids`); with
    `score_kept_sets` (rollout.sampling_replay) the distribution scored, its log-probs, entropy and
    energy, is the sampler's: logits / T truncated to that set and renormalised over it. `return_kept_mass` (last):
    log of the kept set's mass under the full distribution (0 where nothing was filtered).
    With `topk` > 0 (a loss that centres on pi_old's top-K: clip=local), next come the centred
    log-probs psi = log pi(o_t) - sum_{b in T} pbar(b) log pi(b) [N, T] (with the gradient), then
    the support's ids and pbar [N, T, K] and its mass under this distribution [N, T]: `support` (ids,
    pbar) is pi_old's, read from its forward (the mass then None); without it the support is this
    forward's own top-K, detached (this forward is pi_old's, or pi_old is this policy).
    `return_head` (last, score_centering): the log-probs [N, T, k] of the sampler's head ids
    (rollout.head_ids) under the distribution scored, with gradient.
    """
    packing = pack(rollout) if remove_padding and packs(model) else None
    if packing is None:
        num_completion = rollout.completion_mask.shape[1]
        out = model(input_ids=rollout.sequences, attention_mask=rollout.attention_mask,
                    position_ids=positions(rollout.attention_mask), use_cache=False,
                    logits_to_keep=num_completion + 1, output_hidden_states=return_hidden)
        logits = out.logits[:, :-1, :]   # position t predicts completion token t
        hidden = out.hidden_states[-1][:, -(num_completion + 1):-1] if return_hidden else None
    else:
        # no attention mask: transformers then reads the sequences' bounds from the position ids
        out = model(input_ids=packing.input_ids, position_ids=packing.position_ids, use_cache=False,
                    logits_to_keep=packing.keep, output_hidden_states=return_hidden)
        logits = out.logits.flatten(0, 1)[packing.logit_index]
        hidden = out.hidden_states[-1].flatten(0, 1)[packing.hidden_index] if return_hidden else None
    at_least_float32 = torch.promote_types(logits.dtype, torch.float32)   # bf16 up, float64 kept
    log_probs = torch.log_softmax(logits.to(at_least_float32) / temperature, dim=-1)
    tokens = rollout.completion_ids.unsqueeze(-1)
    kept = None if rollout.kept_ids is None else replay_mask(rollout.kept_ids, log_probs.shape[-1])
    if kept is not None:
        # the sampled token is in its set by construction; kept again so a sampler's rounding never gives -inf
        kept = kept.scatter(-1, tokens, True)
        log_mass = torch.logsumexp(log_probs.masked_fill(~kept, float("-inf")), dim=-1)   # log pi(kept set)
        if score_kept_sets:
            log_probs = (log_probs - log_mass.unsqueeze(-1)).masked_fill(~kept, float("-inf"))
    token_logp = log_probs.gather(-1, tokens).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        # a token outside the kept set adds 0 log 0 = 0 (the log-prob read as 0 there: no NaN in the gradient)
        finite_log_probs = log_probs if kept is None or not score_kept_sets else log_probs.masked_fill(~kept, 0.0)
        entropy = -(log_probs.exp() * finite_log_probs).sum(dim=-1)
    out = (token_logp, entropy)
    if return_hidden:  # the last layer's state before each completion token (for a value head)
        out += (hidden.to(at_least_float32),)
    if return_energy:
        with torch.no_grad():
            sum_pi_squared = torch.exp(torch.logsumexp(2.0 * log_probs, dim=-1))   # log_probs are normalized
            out += (1.0 - 2.0 * token_logp.exp() + sum_pi_squared,)
    if return_kept_mass:
        out += (torch.zeros_like(token_logp) if kept is None else log_mass.detach(),)
    if topk > 0:
        ids, pbar, mass = old_topk_support(log_probs, topk) if support is None else (*support, None)
        out += (centred_logprob(log_probs, rollout.completion_ids, ids, pbar), ids, pbar, mass)
    if return_head:
        if rollout.head_ids is None:
            raise RuntimeError("the loss reads the sampler's top-k head, but the rollout carries none")
        out += (log_probs.gather(-1, rollout.head_ids.to(log_probs.device)),)
    return out


def token_logprobs(model, rollout: Rollout, temperature, value_head=None, entropy_grad: bool = False,
                   remove_padding: bool = True, energy: bool = False, score_kept_sets: bool = True,
                   kept_mass: bool = False, topk: int = 0, support: tuple | None = None, head: bool = False):
    """(log-probs [N, T], entropy [N, T], values [N, T] or None): a model's forward over the
    batch, and the critic's value of each completion token when there is a critic (a head on
    the policy's last layer); with `energy`, then each token's logit-gradient energy [N, T]; with
    `kept_mass`, then the log of each token's kept-set mass [N, T]; with `topk`, then the centred
    log-probs, the top-K support's ids, pbar and mass; with `head`, then the log-probs [N, T, k] of
    the sampler's head ids (see completion_logprobs)."""
    logp, entropy, *rest = completion_logprobs(model, rollout, temperature, entropy_grad=entropy_grad,
                                               return_hidden=value_head is not None,
                                               remove_padding=remove_padding, return_energy=energy,
                                               score_kept_sets=score_kept_sets, return_kept_mass=kept_mass,
                                               topk=topk, support=support, return_head=head)
    values = value_head(rest.pop(0)).squeeze(-1) if value_head is not None else None
    return (logp, entropy, values, *rest)
