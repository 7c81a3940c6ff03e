"""Sampling B prompts x G completions with a KV cache, and scoring them (per-token log-probs).

The sampler is a plain loop over `model(...)` with the model's own cache rather than
`model.generate`: for tiny models on a CPU the per-token overhead of `generate` dominates
(W1 decodes 24 tokens for 64 sequences), and the loop is short enough to read.
"""
from __future__ import annotations

import contextlib
import hashlib
import inspect
from dataclasses import dataclass, field, fields

import torch

from grpo_ablate.sampling.filters import NOT_KEPT, SamplingFilters, kept_ids, kept_mask
from grpo_ablate.sampling.lean import LeanDecoder, supports as supports_lean


# rollout.dtype -> the dtype the sampler runs in (None: the model's own)
SAMPLER_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}


class NonFiniteLogits(FloatingPointError):
    """The policy produced NaN/Inf logits while sampling: its weights have diverged."""


@dataclass
class Rollout:
    sequences: torch.Tensor        # [N, P + T] left-padded prompt, then completion (pad after EOS)
    attention_mask: torch.Tensor   # [N, P + T] 1 on real tokens (prompt and completion incl. EOS)
    prompt_len: int                # P, the padded prompt width
    completion_mask: torch.Tensor  # [N, T] 1 on completion tokens up to and including EOS
    truncated: torch.Tensor        # [N] bool: no EOS within max_new_tokens (TRL's test)
    # Optional fields, each declared once with `optional(per, fill)`: `to`, `select_rows` and
    # `concat_rollouts` carry every one of them (per "token": [N, T], right-padded with `fill` and
    # None unless every part has it; per "row": [N], a part without it filled with `fill`).
    # the sampler's own log-prob of each sampled token (log_softmax(logits / T) at it, 0 after
    # EOS): vLLM's, or rollout=hf's when it samples (T > 0)
    sampler_logprobs: torch.Tensor | None = field(default=None, metadata={"per": "token", "fill": 0.0})
    # long: policy versions between the sampler and the trained policy
    ages: torch.Tensor | None = field(default=None, metadata={"per": "row", "fill": 0})
    # bool: False for a row dropped as too stale (None: stale rollouts off)
    kept: torch.Tensor | None = field(default=None, metadata={"per": "row", "fill": True})
    # long: the part of `ages` the row spent done, waiting to be trained (prime-rl's in-queue staleness;
    # the rest, ages - queued, is in flight); None unless the staleness option splits the age
    queued: torch.Tensor | None = field(default=None, metadata={"per": "row", "fill": 0})
    # int32 [N, T, K]: the token ids a filtering sampler (rollout.top_k|top_p|min_p) kept at each token,
    # NOT_KEPT-padded to the batch's widest set (None: the sampler did not filter); sampling/filters.py
    kept_ids: torch.Tensor | None = field(default=None, metadata={"per": "token", "fill": NOT_KEPT})
    # Multi-turn episodes (sampling/multi_turn.py; None for a single completion): the completion holds
    # the policy's turns and the environment's replies between them, as token ids.
    # float: 1 on the tokens the policy sampled, 0 on the environment's (and on padding)
    sampled: torch.Tensor | None = field(default=None, metadata={"per": "token", "fill": 0.0})
    # long: the turn each completion token belongs to (a reply belongs to the turn it answers)
    turn_index: torch.Tensor | None = field(default=None, metadata={"per": "token", "fill": 0})
    # long: the policy turns the episode took
    turns: torch.Tensor | None = field(default=None, metadata={"per": "row", "fill": 1})
    # long: its turns that ended without a usable tool reply (a call that did not parse, a tool
    # that raised, a turn over the per-turn token budget)
    failed_turns: torch.Tensor | None = field(default=None, metadata={"per": "row", "fill": 0})
    # float: the sum of the episode's turn-level rewards (Reply.reward; 0 when its turns carry none)
    turn_reward: torch.Tensor | None = field(default=None, metadata={"per": "row", "fill": 0.0})
    # long [N, T, k]: the sampler's k most probable ids at each token, and float [N, T, k] their log-probs
    # under the distribution it drew from (full-vocabulary mass, -inf after EOS); None unless an option
    # reads the head (score_centering: `generate(head=k)`, vLLM's logprobs=k)
    head_ids: torch.Tensor | None = field(default=None, metadata={"per": "token", "fill": 0})
    head_logprobs: torch.Tensor | None = field(default=None, metadata={"per": "token", "fill": float("-inf")})

    def to(self, device) -> "Rollout":
        return _each_tensor(self, lambda t: t.to(device))

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_len:]

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(dim=1)

    @property
    def sampled_mask(self) -> torch.Tensor:
        """[N, T] 1 on the completion tokens the policy sampled: the completion mask, less the
        environment's tokens of a multi-turn episode."""
        return self.completion_mask if self.sampled is None else self.completion_mask * self.sampled


def left_pad(prompts: list[list[int]], pad_id: int):
    """Left-pad token id lists into [N, P] ids and mask (generation appends on the right)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids, mask


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that start at 0 on the first real token of each left-padded row."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)


def _cache_kwarg(model) -> str:
    """transformers 5.x renamed `past_key_values` to `cache`; accept either release line (a
    LoRA model's forward passes keyword arguments through: ask the model it wraps)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(type(base).forward).parameters else "past_key_values"


class _HFStepper:
    """One decoding step through the model's own forward and KV cache (all rows, always)."""

    compacts = False

    def __init__(self, model):
        self.model, self.cache, self.cache_kwarg = model, None, _cache_kwarg(model)

    def __call__(self, input_ids, position_ids, attention_mask, start):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1, **{self.cache_kwarg: self.cache})
        self.cache = getattr(out, self.cache_kwarg)
        return out.logits[:, -1, :]


class _LeanStepper:
    """The same step through LeanDecoder; rows that have finished can be dropped (`keep`), so
    decoding costs what the still-running completions need."""

    compacts = True

    def __init__(self, model, batch: int, slots: int, dtype: torch.dtype | None = None):
        self.decoder = LeanDecoder(model, dtype)
        self.cache_k, self.cache_v = self.decoder.new_cache(batch, slots)

    def keep(self, rows: torch.Tensor) -> None:
        self.cache_k, self.cache_v = self.cache_k[:, rows], self.cache_v[:, rows]

    def __call__(self, input_ids, position_ids, attention_mask, start):
        key_bias = torch.where(attention_mask.bool(), 0.0, float("-inf"))[:, None, None, :]
        return self.decoder.forward(input_ids, position_ids, self.cache_k, self.cache_v, start, key_bias)


@dataclass
class RowNoise:
    """rollout.rng=per_row: the uniform that picks each sampled token comes from a generator
    seeded by `seed` (one per sampling call), which draws one uniform for every row of the whole
    batch (`total` rows) at every token; this process's rows, starting at global row `first`,
    take theirs. A row's tokens then depend only on its index, never on how the rows are split
    across processes (torchrun) or which other rows are still decoding. `rows`: the global indices of
    the call's rows when they are not first, first + 1, ... (a multi-turn turn samples only the rows
    whose episode is still running)."""
    seed: int
    first: int
    total: int
    rows: tuple[int, ...] | None = None

    def indices(self, n: int) -> list[int]:
        """The global index of each of the call's `n` rows."""
        return list(self.rows) if self.rows is not None else list(range(self.first, self.first + n))


def derived_seed(seed: int, key: tuple) -> int:
    """A seed for one sampling call, a pure function of the run's seed and the call's key."""
    return int.from_bytes(hashlib.sha256(repr((int(seed), key)).encode()).digest()[:8], "little") >> 1


def sampler_seed(seed: int, stream_salt: int) -> int:
    """The seed of the sampler's draws (rollout.stream_salt): the run's seed itself at salt 0, so runs
    from before the salt sample as they did; another salt, another stream from the same seed."""
    return int(seed) if not stream_salt else derived_seed(seed, ("stream", int(stream_salt)))


@torch.no_grad()
def generate(model, prompts: list[list[int]], *, num_samples: int, max_new_tokens: int,
             temperature: float, eos_id: int | list[int], pad_id: int,
             generator: torch.Generator | None = None, lean: bool = True,
             noise: RowNoise | None = None, dtype: str = "float32",
             filters: SamplingFilters | None = None, head: int = 0) -> Rollout:
    """Sample `num_samples` completions per prompt (rows ordered prompt-major: group g is rows
    g*G .. g*G+G-1). temperature == 0 means greedy decoding (evaluation). With `lean`, models
    of a supported architecture decode through LeanDecoder (same math, less overhead) on a CPU
    (a LoRA model's adapters are merged into LeanDecoder's weight snapshot). `eos_id` may be a list of
    stop ids. A model in training mode samples in eval mode (no dropout; with gradient
    checkpointing transformers would otherwise switch the KV cache off).

    When it samples (temperature > 0) the rollout carries the sampler's own log-prob of each
    sampled token, log_softmax(logits / T) at it (`sampler_logprobs`, as vLLM's). `dtype`
    (rollout.dtype) "bfloat16" samples in bf16 -- LeanDecoder with bf16 weights, the
    transformers forward under torch.autocast -- while training stays in the model's dtype: a
    real sampler-trainer mismatch, as with vLLM; "float32" samples in the model's own dtype.
    `filters` (rollout.top_k|top_p|min_p): each token is drawn from the tempered distribution
    truncated to its kept set and renormalised; the rollout carries the sets (`kept_ids`) and the
    sampler log-probs are the renormalised distribution's. `head` > 0 (score_centering): when it
    samples, the rollout carries the sampler's `head` most probable ids at each token and their
    log-probs (`head_ids`, `head_logprobs`: vLLM's logprobs=k), at the cost of a top-k a token."""
    if model.training:
        model.eval()
        try:
            return generate(model, prompts, num_samples=num_samples, max_new_tokens=max_new_tokens,
                            temperature=temperature, eos_id=eos_id, pad_id=pad_id, generator=generator,
                            lean=lean, noise=noise, dtype=dtype, filters=filters, head=head)
        finally:
            model.train()
    ids, mask = left_pad(prompts, pad_id)
    ids = ids.repeat_interleave(num_samples, dim=0)
    mask = mask.repeat_interleave(num_samples, dim=0)
    n, prompt_len = ids.shape
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    if isinstance(eos_id, (list, tuple)):
        eos_id = torch.tensor(eos_id, device=device)
    lean = lean and device.type == "cpu" and supports_lean(model)   # LoRA: merged into its snapshot
    low_precision = SAMPLER_DTYPES[dtype]
    step = (_LeanStepper(model, n, prompt_len + max_new_tokens, low_precision) if lean else _HFStepper(model))
    uniforms = torch.Generator().manual_seed(noise.seed) if noise is not None else None
    autocast = (torch.autocast(device.type, dtype=low_precision) if low_precision is not None and not lean
                else contextlib.nullcontext())
    with autocast:
        return _decode(step, ids, mask, max_new_tokens=max_new_tokens, temperature=temperature, eos_id=eos_id,
                       pad_id=pad_id, generator=generator, noise=noise, uniforms=uniforms,
                       filters=filters if filters is not None and filters.truncates and temperature > 0 else None,
                       head=head if temperature > 0 else 0)


def _truncated(probs, filters: SamplingFilters) -> tuple[torch.Tensor, torch.Tensor]:
    """The distributions truncated to their kept sets and renormalised over them, and the sets' ids."""
    kept = kept_mask(probs, filters)
    probs = torch.where(kept, probs, torch.zeros_like(probs))
    return probs / probs.sum(dim=-1, keepdim=True), kept_ids(kept)


def _draw(probs, active, n: int, generator, noise: RowNoise | None, uniforms) -> torch.Tensor:
    """One token for each active row from its distribution `probs`: from the run's stream, or
    (rollout.rng=per_row) by inverse-CDF sampling with each row's own uniform."""
    if noise is None:
        return torch.multinomial(probs, 1, generator=generator).squeeze(1)
    cdf = probs.cumsum(dim=-1)
    u = torch.rand(noise.total, generator=uniforms)[noise.indices(n)].to(probs.device)[active]
    token = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(1)
    return token.clamp(max=cdf.shape[-1] - 1)


def _decode(step, ids, mask, *, max_new_tokens, temperature, eos_id, pad_id, generator, noise, uniforms,
            filters: SamplingFilters | None = None, head: int = 0) -> Rollout:
    """The decoding loop of `generate`: one token for every unfinished row per step."""
    n, prompt_len = ids.shape
    device = ids.device

    new_tokens = torch.full((n, max_new_tokens), pad_id, dtype=torch.long, device=device)
    sampler_logp = torch.zeros((n, max_new_tokens), device=device) if temperature > 0 else None
    finished = torch.zeros(n, dtype=torch.bool, device=device)
    full_mask = torch.cat([mask, torch.zeros_like(new_tokens)], dim=1)
    active = torch.arange(n, device=device)  # rows the stepper still decodes
    step_input, pos = ids, positions(mask)
    steps_taken = 0
    kept_sets = []   # (rows, token index, their kept ids) of every filtered step
    head_ids = head_logp = None   # the sampler's top-`head` ids and log-probs at every token (head > 0)
    for t in range(max_new_tokens):
        width = prompt_len + t  # tokens visible to this forward, including the new ones
        logits = step(step_input, pos, full_mask[active, :width], width - step_input.shape[1]).float()
        if not bool(torch.isfinite(logits).all()):
            raise NonFiniteLogits(f"non-finite logits while sampling token {t}")
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            if filters is not None:
                probs, kept = _truncated(probs, filters)
                kept_sets.append((active, t, kept))
            if head:
                top = probs.topk(min(head, probs.shape[-1]), dim=-1)
                if head_ids is None:
                    head_ids = torch.zeros((n, max_new_tokens, top.indices.shape[-1]), dtype=torch.long, device=device)
                    head_logp = torch.full(head_ids.shape, float("-inf"), device=device)
                head_ids[active, t], head_logp[active, t] = top.indices, top.values.log()
            token = _draw(probs, active, n, generator, noise, uniforms)
            # the sampler's log-prob of its token under the distribution it sampled from: the log
            # of the softmax it drew from is log_softmax(logits / T) there up to float32 rounding
            # (~1e-7), at O(rows) cost (a second pass over the vocabulary, logsumexp, would cost
            # a quarter of the sampling step at V = 32k)
            token_logp = probs.gather(1, token[:, None]).squeeze(1).log()
            sampler_logp[active, t] = torch.where(finished[active], torch.zeros_like(token_logp), token_logp)
        else:
            token = logits.argmax(dim=-1)
        token = torch.where(finished[active], torch.full_like(token, pad_id), token)
        new_tokens[active, t] = token
        full_mask[active, width] = (~finished[active]).long()  # EOS itself is a trained token
        finished[active] |= torch.isin(token, eos_id) if isinstance(eos_id, torch.Tensor) else token == eos_id
        steps_taken = t + 1
        if bool(finished.all()):
            break  # every row has emitted EOS: stop decoding early
        running = ~finished[active]
        # drop finished rows once a quarter of the decoded batch is done (a cache copy each time)
        if step.compacts and int(running.sum()) <= 3 * len(active) // 4:
            keep = running.nonzero().squeeze(1)
            step.keep(keep)
            active, token, pos = active[keep], token[keep], pos[keep]
        step_input = token[:, None]
        pos = pos[:, -1:] + 1

    completion = new_tokens[:, :steps_taken]
    completion_mask = full_mask[:, prompt_len:prompt_len + steps_taken].float()
    return Rollout(
        sequences=torch.cat([ids, completion], dim=1),
        attention_mask=full_mask[:, :prompt_len + steps_taken],
        prompt_len=prompt_len,
        completion_mask=completion_mask,
        truncated=~finished,
        sampler_logprobs=None if sampler_logp is None else sampler_logp[:, :steps_taken] * completion_mask,
        kept_ids=_stacked_kept_sets(kept_sets, n, steps_taken, completion_mask) if filters is not None else None,
        **({} if head_ids is None else _head_of(head_ids[:, :steps_taken], head_logp[:, :steps_taken],
                                                completion_mask)),
    )


def _head_of(ids: torch.Tensor, logprobs: torch.Tensor, completion_mask: torch.Tensor) -> dict:
    """The head fields of a Rollout, blanked after each row's EOS (ids 0, log-probs -inf)."""
    after = completion_mask[..., None] == 0
    return {"head_ids": ids.masked_fill(after, 0), "head_logprobs": logprobs.masked_fill(after, float("-inf"))}


def _stacked_kept_sets(kept_sets: list, n: int, steps: int, completion_mask: torch.Tensor) -> torch.Tensor:
    """[n, steps, K] the kept ids of every decoding step's rows, NOT_KEPT after a row's EOS."""
    width = max((ids.shape[1] for _, _, ids in kept_sets), default=1)
    out = torch.full((n, steps, width), NOT_KEPT, dtype=torch.int32, device=completion_mask.device)
    for rows, t, ids in kept_sets:
        out[rows, t, :ids.shape[1]] = ids
    return out.masked_fill(completion_mask[..., None] == 0, NOT_KEPT)


def _each_tensor(roll: Rollout, fn) -> Rollout:
    """The rollout with `fn` applied to every tensor field (each has the rows first), None kept."""
    return Rollout(**{f.name: fn(value) if isinstance(value, torch.Tensor) else value
                      for f in fields(roll) for value in [getattr(roll, f.name)]})


def select_rows(roll: Rollout, rows: torch.Tensor) -> Rollout:
    return _each_tensor(roll, lambda t: t[rows])


def concat_rollouts(rolls: list[Rollout], pad_id: int) -> Rollout:
    """Stack rollouts of different prompt and completion widths (prompts stay left-padded,
    completions right-padded), e.g. the rounds of dynamic sampling."""
    if len(rolls) == 1:
        return rolls[0]
    prompt_len = max(r.prompt_len for r in rolls)
    width = max(r.completion_mask.shape[1] for r in rolls)
    seqs, masks, cmasks = [], [], []
    for r in rolls:
        left, right = prompt_len - r.prompt_len, width - r.completion_mask.shape[1]
        seqs.append(torch.nn.functional.pad(r.sequences, (left, right), value=pad_id))
        masks.append(torch.nn.functional.pad(r.attention_mask, (left, right), value=0))
        cmasks.append(torch.nn.functional.pad(r.completion_mask, (0, right), value=0))
    optional = {f.name: _concat_optional([getattr(r, f.name) for r in rolls], f.metadata, width,
                                         [len(r.truncated) for r in rolls])
                for f in fields(Rollout) if f.metadata}
    return Rollout(torch.cat(seqs), torch.cat(masks), prompt_len, torch.cat(cmasks),
                   torch.cat([r.truncated for r in rolls]), **optional)


def _concat_optional(parts: list, declared: dict, width: int, sizes: list[int]):
    """One optional field of the parts stacked, as its declaration says (see Rollout)."""
    if declared["per"] == "token":
        if any(p is None for p in parts):
            return None
        # a kept-id list [N, T, K] is padded on its last dim too, to the widest part's K
        sets = max(p.shape[-1] for p in parts)
        return torch.cat([torch.nn.functional.pad(p, ((0, sets - p.shape[2]) if p.dim() == 3 else ()) +
                                                  (0, width - p.shape[1]), value=declared["fill"]) for p in parts])
    return _concat_rows(parts, sizes, declared["fill"])


def _concat_rows(parts: list, sizes: list[int], fill):
    """Per-row tensors stacked; a part without one (None) filled with `fill`; None if none has one."""
    like = next((p for p in parts if p is not None), None)
    if like is None:
        return None
    return torch.cat([p if p is not None else torch.full((n,), fill, dtype=like.dtype, device=like.device)
                      for p, n in zip(parts, sizes)])


def decode_completions(tokenizer, rollout: Rollout) -> list[str]:
    """Completion texts cut at EOS (special tokens dropped)."""
    ids = rollout.completion_ids.masked_fill(rollout.completion_mask == 0, tokenizer.pad_token_id)
    return tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)
