"""Family `loss_agg`: how per-token losses become one number.

Every mode is a per-token weight w[j, t] with loss = sum_jt w * l. Computing the weights once
for the whole optimizer step keeps the normalizers global: a micro-batch contributes
sum(w_mb * l_mb) and the micro-batch sums add up to exactly the full-batch loss (TRL `dapo`
counts tokens over the whole step, not per micro-batch).

| mode                 | loss                              | weight of a token of o_j |
| seq_mean_token_mean  | (1/B) sum_j (1/n_j) sum_t l       | 1/(B n_j)   (GRPO; TRL `grpo`)      |
| token_mean           | sum_jt l / sum_j n_j              | 1/sum n     (DAPO; TRL `dapo`)      |
| seq_mean_token_sum   | (1/B) sum_j sum_t l               | 1/B                                 |
| constant             | sum_jt l / (B L_max)              | 1/(B L_max) (Dr. GRPO; TRL `dr_grpo`) |
| token_sum            | sum_jt l                          | 1           (verl `token-sum`)      |
| prompt_mean          | (1/P) sum_p (sum_{j in p} sum_t l) / n_p | 1/(P n_p) (SkyRL `prompt_mean`) |
| turn_mean            | (1/K) sum_(j,k) (1/n_jk) sum_{t in turn k} l | 1/(K n_jk) (SkyRL step-wise `sequence_mean`) |

Flag `weights_by_length`: a sequence's total weight grows with its length (every mode but
seq_mean_token_mean; within each prompt's group for prompt_mean; with its number of turns for turn_mean).

Reference: verl core_algos `agg_loss`; ROLL functionals `agg_loss`. Fully masked sequences are
left out of B in the seq_* modes (verl); an all-masked batch gives all-zero weights, so the
loss is 0, never NaN. L_max is the generation budget (max_new_tokens), as in Dr. GRPO's code.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.conditions import single_turn
from grpo_ablate.tricks.registry import (DAPO, SCALERL, TRICKS_OR_TRAPS, Activity, Claim, Inert, Trick, declare_family,
                                         register)

declare_family("loss_agg", "per-token loss weights", stage="loss", default="seq_mean_token_mean", metric="loss")

def _as_float(mask: torch.Tensor) -> torch.Tensor:
    return mask.to(torch.get_default_dtype() if not mask.is_floating_point() else mask.dtype)


def _live_sequences(mask: torch.Tensor) -> torch.Tensor:
    """B of the seq_* modes: sequences with at least one trained token."""
    return (mask.sum(dim=1, keepdim=True) > 0).to(mask.dtype).sum().clamp(min=1)


# Every mode: (mask [B, T], max_len, group_index [B] or None, turn_index [B, T] or None) -> weights w [B, T]
# such that the loss is (w * l).sum(); group_index (row -> its prompt) is read by prompt_mean only, turn_index
# (token -> the episode's turn it belongs to, sampling/multi_turn.py; None: one turn a row) by turn_mean only.
@register("loss_agg", "token_mean",
          what="DAPO / Lite PPO: one average over all completion tokens of the step",
          weights_by_length=True,
          tricks=(Trick("token_mean",
                        what="one mean over all tokens of the step (DAPO)",
                        source="TRL loss_type=dapo; verl loss_agg_mode=token-mean",
                        verdict="not_applicable",
                        claims=(
                            Claim("helps", "model=base", TRICKS_OR_TRAPS,
                                  "token-level loss aggregation suits base models: every token teaches"),
                            Claim("hurts", "model=aligned", TRICKS_OR_TRAPS,
                                  "sequence-level aggregation suits aligned models better than token-level"),
                            Claim("helps", "model=base", DAPO,
                                  "the token-level policy-gradient loss: one of DAPO's four techniques (long chains "
                                  "of thought)"),)),))
def token_mean_weights(mask: torch.Tensor, max_len: int | None,
                       group_index: torch.Tensor | None = None,
                       turn_index: torch.Tensor | None = None) -> torch.Tensor:
    mask = _as_float(mask)
    return mask / mask.sum().clamp(min=1)


@register("loss_agg", "seq_mean_token_mean",
          what="GRPO: average over tokens of each sequence, then over sequences")
def seq_mean_token_mean_weights(mask: torch.Tensor, max_len: int | None,
                                group_index: torch.Tensor | None = None,
                                turn_index: torch.Tensor | None = None) -> torch.Tensor:
    mask = _as_float(mask)
    return mask / mask.sum(dim=1, keepdim=True).clamp(min=1) / _live_sequences(mask)


@register("loss_agg", "seq_mean_token_sum",
          what="sum over tokens of each sequence, average over sequences",
          weights_by_length=True,
          tricks=(Trick("seq_token_sum",
                        what="sum over tokens, mean over sequences",
                        source="verl loss_agg_mode=seq-mean-token-sum",
                        verdict="not_applicable"),))
def seq_mean_token_sum_weights(mask: torch.Tensor, max_len: int | None,
                               group_index: torch.Tensor | None = None,
                               turn_index: torch.Tensor | None = None) -> torch.Tensor:
    mask = _as_float(mask)
    return mask / _live_sequences(mask)


@register("loss_agg", "constant",
          what="Dr. GRPO: sum over all tokens / (B * max_new_tokens)",
          weights_by_length=True,
          tricks=(Trick("dr_grpo_norm",
                        what="sum over tokens / (B * max_new_tokens) (Dr. GRPO)",
                        source="TRL loss_type=dr_grpo",
                        verdict="not_applicable"),))
def constant_weights(mask: torch.Tensor, max_len: int | None,
                     group_index: torch.Tensor | None = None,
                     turn_index: torch.Tensor | None = None) -> torch.Tensor:
    """Dr. GRPO's constant normalizer: B * L_max, L_max the generation budget."""
    if not max_len or max_len <= 0:
        raise ValueError("loss_agg mode 'constant' needs max_len > 0 (the generation budget)")
    mask = _as_float(mask)
    return mask / (mask.shape[0] * max_len)


@register("loss_agg", "token_sum",
          what="verl token-sum: the plain sum of every token's loss (no normalizer; the lr absorbs the scale)",
          weights_by_length=True,
          tricks=(Trick("token_sum",
                        what="plain sum of every token's loss (no normalizer)",
                        source="verl loss_agg_mode=token-sum",
                        verdict="not_in_review"),))
def token_sum_weights(mask: torch.Tensor, max_len: int | None,
                      group_index: torch.Tensor | None = None,
                      turn_index: torch.Tensor | None = None) -> torch.Tensor:
    """No normalizer at all: the loss grows with the batch's token count (verl loss_agg_mode=
    token-sum, which scales each rank's sum by dp_size so the averaged gradient is the global
    sum). The learning rate must absorb the scale."""
    return _as_float(mask).clone()


@register("loss_agg", "prompt_mean",
          what="ScaleRL / SkyRL loss_reduction=prompt_mean: token mean within each prompt's group, then mean over "
               "prompts",
          weights_by_length=True,
          tricks=(Trick("prompt_mean",
                        what="token mean within each prompt's group, then the mean over prompts (ScaleRL)",
                        source="SkyRL loss_reduction=prompt_mean (skyrl_train/utils/ppo_utils.py); ScaleRL "
                               "(arXiv 2510.13786)",
                        verdict="not_in_review",
                        claims=(Claim("no effect", "", SCALERL,
                                      "loss aggregation moves compute efficiency, not the asymptote",
                                      measure="ceiling"),)),))
def prompt_mean_weights(mask: torch.Tensor, max_len: int | None,
                        group_index: torch.Tensor | None = None,
                        turn_index: torch.Tensor | None = None) -> torch.Tensor:
    """Prompt-level mean (ScaleRL's aggregation): each prompt's group weighs the same, its tokens
    share that weight equally, so a group of long completions weighs no more than one of short.

        w[j, t] = 1 / (P n_p),  n_p the trained tokens of the group of prompt p = group(j),
                                P the prompts with at least one trained token

    Reference: SkyRL `normalize_advantages_for_loss_reduction` (loss_reduction=prompt_mean: 1 /
    (num_prompts * tokens_in_prompt)). Difference: SkyRL counts every prompt of the mini-batch
    in P; here a prompt whose tokens are all masked is left out (as the seq_* modes leave out
    such sequences, verl). With equal group sizes it differs from token_mean only through the
    groups' token counts (TRL trl#5375: its `grpo` loss equals it for equal groups only when
    lengths are equal too). Without group_index every row is its own prompt (seq_mean_token_mean).
    """
    mask = _as_float(mask)
    if group_index is None:
        return seq_mean_token_mean_weights(mask, max_len)
    groups = torch.unique(group_index, return_inverse=True)[1].to(mask.device)
    count = int(groups.max()) + 1 if groups.numel() else 0
    tokens = torch.zeros(count, dtype=mask.dtype, device=mask.device).index_add_(0, groups, mask.sum(dim=1))
    prompts = (tokens > 0).to(mask.dtype).sum().clamp(min=1)
    return mask / tokens.clamp(min=1)[groups][:, None] / prompts


def turn_lengths(mask: torch.Tensor, turn_index: torch.Tensor) -> torch.Tensor:
    """[B, K] the trained tokens of each row's turns (K = the batch's last turn + 1): the mask summed
    over the tokens of each turn. A reply belongs to the turn it answers (sampling/multi_turn.py), so
    it counts where the mask trains it (env_mask=unmasked), nowhere under env_mask=masked."""
    turn_index = turn_index.to(mask.device).long()
    turns = int(turn_index.max()) + 1 if turn_index.numel() else 1
    return torch.zeros(mask.shape[0], turns, dtype=mask.dtype, device=mask.device).scatter_add_(1, turn_index, mask)


@register("loss_agg", "turn_mean",
          what="multi-turn: average over the tokens of each policy turn, then over the step's turns (SkyRL's "
               "step-wise training with loss_reduction=sequence_mean)",
          weights_by_length=True,
          activity=Activity("turns/mean", "above", 1.0),
          inert=Inert(single_turn, "cannot act on a single-completion task: every row is one turn, so it is "
                      "seq_mean_token_mean", "train a multi-turn task (task=calculator)",
                      "a multi-turn task (task.max_turns)"),
          tricks=(Trick("turn_mean",
                        what="each policy turn weighs the same: its tokens averaged, then the step's turns",
                        source="SkyRL a956457 generator.step_wise_trajectories=true with trainer.algorithm."
                               "loss_reduction=sequence_mean (docs tutorials/step-wise-training.mdx; "
                               "ppo_utils.py normalize_advantages_for_loss_reduction)",
                        verdict="not_in_review"),))
def turn_mean_weights(mask: torch.Tensor, max_len: int | None, group_index: torch.Tensor | None = None,
                      turn_index: torch.Tensor | None = None) -> torch.Tensor:
    """Turn-level mean: every policy turn of the step weighs the same, its trained tokens share that
    weight equally, so an episode weighs by its number of turns and a long turn no more than a short one.

        w[j, t] = m[j, t] / (K n_jk),  k = turn_index[j, t], n_jk = sum_t' m[j, t'] [turn_index[j, t'] = k],
                                       K = the (row, turn) pairs with n_jk > 0

    Reference: SkyRL (NovaSky-AI/SkyRL a956457) trains a multi-turn episode step-wise
    (`generator.step_wise_trajectories`): each turn is its own sequence, so its `sequence_mean`
    (`normalize_advantages_for_loss_reduction`: A / (batch_size * the sequence's tokens)) is this
    mean; its docs say so ("trajectories with more turns contribute proportionally more to the
    loss"). Here the episode stays one sequence and the turns are read from turn_index. Difference:
    SkyRL's batch_size counts every step-sample of the mini-batch; here K leaves out a turn with no
    trained token (an episode masked out by overlong=filter), as the seq_* modes leave out such
    sequences (verl). Without turn_index (a single-completion task) every row is one turn: exactly
    seq_mean_token_mean.
    """
    mask = _as_float(mask)
    if turn_index is None:
        return seq_mean_token_mean_weights(mask, max_len)
    turn_index = turn_index.to(mask.device).long()
    lengths = turn_lengths(mask, turn_index)
    turns = (lengths > 0).to(mask.dtype).sum().clamp(min=1)
    return mask / lengths.gather(1, turn_index).clamp(min=1) / turns


def aggregate(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The one aggregation: sum of weighted per-token values."""
    return (values * weights).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Plain token mean, for metrics (0 when nothing is masked in)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)
