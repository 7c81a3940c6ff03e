"""Family `length`: length terms added to the reward (the seed review's top pick).

Every option returns (rewards, length_reward) with length_reward [N] what was added.
`penalty`: r <- r - lam * |o| / L, L = max_new_tokens (lam = 0.1).
`group` (Kimi k1.5 length reward, group-relative form): in each group
    lam_j = 0.5 - (|o_j| - min_len) / (max_len - min_len)      (0 when all lengths are equal)
correct completions get + w * lam_j, wrong ones + w * min(0, lam_j) (w = 1.0): short correct
answers are rewarded, long wrong ones punished, short wrong ones never rewarded.
Reference: Kimi k1.5 (arXiv 2501.12599), section 2.3.3.
`linear` (prime-rl's linear length penalty): r <- r - pass_rate * (terms), see `linear_length_penalty`.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import (NON_NEGATIVE, NUMBER, SEED_REVIEW, Activity, Claim, Inert, Trick,
                                         declare_family, register)

declare_family("length", "length terms in the reward; `group` is Kimi k1.5's",
               stage="reward", metric="length/reward_mean")


@register("length", "none")
def no_length(rewards, lengths, group_index, correct, max_len):
    return rewards, torch.zeros_like(rewards)


@register("length", "penalty",
          what="r <- r - lam * |o| / max_new_tokens lam < 0 turns the penalty into a length bonus that favours long "
               "outputs (e.g. to buy longer reasoning); against a penalty that favours short ones "
               "(overlong=soft_punish) the two pull apart, which the gradient-conflict diagnostics show "
               "(tests/test_diagnostics.py)",
          shapes_reward=True,
          knobs={"lam": NUMBER},
          activity=Activity("length/reward_mean"),
          tricks=(Trick("length_penalty",
                        what="reward minus 0.1 * length / budget",
                        source="seed review: length normalization",
                        verdict="strongly_recommended",
                        claims=(
                            Claim("helps", "", SEED_REVIEW,
                                  "length normalization: high gain, high stability (strongly recommended; essentially"
                                  " required for math and code)"),)),))
def length_penalty(rewards, lengths, group_index, correct, max_len, *, lam: float = 0.1):
    bonus = -lam * lengths.to(rewards.dtype) / max_len
    return rewards + bonus, bonus


@register("length", "group",
          what="Kimi k1.5 group-relative length reward: short correct answers up, long wrong ones down",
          shapes_reward=True,
          knobs={"weight": NUMBER},
          activity=Activity("length/reward_mean"),
          tricks=(Trick("length_group",
                        what="Kimi k1.5 group length reward",
                        source="Kimi k1.5",
                        verdict="strongly_recommended",
                        claims=(
                            Claim("helps", "", SEED_REVIEW,
                                  "length normalization: high gain, high stability (strongly recommended; essentially"
                                  " required for math and code)"),)),))
def group_length_reward(rewards, lengths, group_index, correct, max_len, *, weight: float = 1.0):
    lengths = lengths.to(rewards.dtype)
    lo, hi = _group_reduce(lengths, group_index, "amin"), _group_reduce(lengths, group_index, "amax")
    spread = hi - lo
    lam = torch.where(spread > 0, 0.5 - (lengths - lo) / spread.clamp(min=1e-12), torch.zeros_like(lengths))
    bonus = weight * torch.where(correct, lam, lam.clamp(max=0.0))
    return rewards + bonus, bonus



def _group_reduce(values, group_index, how: str):
    """Each row's group statistic (scatter `how`: amin, amax or mean) of `values` [N], back on the rows."""
    n_groups = int(group_index.max()) + 1
    start = {"amin": float("inf"), "amax": float("-inf"), "mean": 0.0}[how]
    out = torch.full((n_groups,), start, dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, group_index, values, how, include_self=how != "mean")[group_index]


LINEAR_WEIGHTS_ZERO = Inert(
    lambda cfg: all(float(cfg.length[k]) == 0 for k in ("output_weight", "context_weight", "turns_weight")),
    "cannot act with length.output_weight, context_weight and turns_weight all 0 (the penalty is 0)",
    "give length.output_weight > 0 (prime-rl's 0.25)", "a weight above 0")


@register("length", "linear",
          what="prime-rl's linear length penalty: r <- r - pass_rate * (output_weight * |o| / group max |o| + "
               "context_weight * context / group max + turns_weight * turns / group max); every row here is one turn "
               "of its group's prompt, so the last two terms are constant within a group",
          shapes_reward=True,
          knobs={"output_weight": NON_NEGATIVE, "context_weight": NON_NEGATIVE, "turns_weight": NON_NEGATIVE},
          activity=Activity("length/reward_mean"), inert=LINEAR_WEIGHTS_ZERO,
          tricks=(Trick("linear_length_penalty",
                        what="prime-rl's linear length penalty: reward minus the group's mean reward times "
                             "(0.25 output / group max + 0.1 context / group max + 0.1 turns / group max)",
                        source="prime-rl 16efd8afd (#2901) algorithm.length_penalty type=linear "
                               "(orchestrator/algo/grpo.py GRPOAlgorithm.score_group)",
                        verdict="not_in_review"),))
def linear_length_penalty(rewards, lengths, group_index, correct, max_len, *, output_weight: float = 0.25,
                          context_weight: float = 0.1, turns_weight: float = 0.1):
    """prime-rl 16efd8afd (#2901), `GRPOAlgorithm.score_group` with `LinearLengthPenaltyConfig`:

        frac_i = w_out * out_i / max_g out + w_ctx * ctx_i / max_g ctx + w_turns * turns_i / max_g turns
        r_i <- r_i - pass_rate_g * frac_i,      pass_rate_g = the mean reward of i's group g

    each max over the group and clamped to >= 1 (prime-rl `.max().clamp(min=1)`), before the
    baseline (the advantage chain runs after the length family). Decisions:
    - pass_rate is what the code computes, the group's mean reward (`rewards.mean()`), not a count
      of correct answers: the two agree for 0/1 rewards; with reward.wrong=-1 a group that mostly
      fails has a negative mean and the penalty turns into a bonus, as it would in prime-rl.
    - context is prime-rl's input tokens (total - output: the prompt, tool responses). Every row
      here is one turn of its group's one prompt, so ctx_i = max_g ctx and turns_i = max_g turns = 1:
      both terms are the constant pass_rate_g * (w_ctx + w_turns) within a group. A group-centred
      estimator (adv=grpo, rloo, ...) cancels them; adv=batch does not (the constant differs across
      groups). The data arguments carry no prompt length or turn count until a task has turns.
    - `correct` is unused: prime-rl's review dropped its gate_by_correctness."""
    lengths = lengths.to(rewards.dtype)
    longest = _group_reduce(lengths, group_index, "amax").clamp(min=1)
    single_turn = torch.ones_like(rewards)     # ctx_i / max_g ctx and turns_i / max_g turns (see above)
    fraction = output_weight * lengths / longest + (context_weight + turns_weight) * single_turn
    penalty = _group_reduce(rewards, group_index, "mean") * fraction
    return rewards - penalty, -penalty
