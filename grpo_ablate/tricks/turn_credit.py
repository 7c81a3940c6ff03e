"""Family `turn_credit`: where a multi-turn episode's turn-level reward is credited (MT-GRPO).

An environment may reward a turn on its own (`Reply.reward`: a tool call that executed), beside
the outcome reward at the episode's end; the episode's turn reward R^T is their sum
(sampling/multi_turn.py), its outcome reward R^O the shaped reward. Zeng et al. 2025 ("Reinforcing
Multi-Turn Reasoning in LLM Agents via Turn-Level Credit Assignment", arXiv 2505.11821; code
SiliangZeng/Multi-Turn-RL-Agent at 7860de6, `MTGRPOEnvTrainer._assign_advantages`, advantage_est
"aae" and "cae") give four ways of using them, each A(.) the run's advantage chain (reward_norm -> adv ->
adv_clip) applied to a reward:

    outcome   A_t = A(R^O)                       R^T unused (the paper's GRPO-OR)
    merged    A_t = A(R^O + R^T)                 one trajectory reward (GRPO-MR)
    mt_grpo   A_t = A(R^O) + c A(R^T) [t < b]    an episode with an environment reply: the tokens
                                                  before its first reply (b) also get the turn term
              A_t = A(R^O + R^T)                 an episode without one (answered without the tool)
    mt_grpo_cumulative                            the source's "cae" estimate:
              A_t = A(R^T + g R^O) [t < b] + A(R^O) [t >= b]   with a reply
              A_t = A(R^T + g R^O)               without one

b is the episode's first environment token (the source splits at the first tool result: its
`_find_result_positions` and the mask's segment boundaries), so the turn term lands on the turn
that called the tool, the outcome's on every turn. Every option takes (outcome_advantage [N] or
[N, T], turn_reward [N], before_reply [N, T] (1 on the completion positions before the first
environment token), replied [N] bool, advantage_of) and returns the advantages [N] or [N, T];
`advantage_of(a, b)`, supplied by the trainer, is the chain's advantage of a R^O + b R^T (its
parts scaled alike, for an estimator that normalizes each).

Decided here: R^T sums every turn's reward (the source's turn reward functions score the whole
transcript). A single-completion task has no turn reward: the trainer does not call the family
(train/rewards.py: no TurnRewards), so every option is A(R^O) there.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.conditions import single_turn
from grpo_ablate.tricks.registry import (FRACTION, NON_NEGATIVE, Activity, Claim, Inert, Trick, declare_family, option,
                                         register)

declare_family("turn_credit", "multi-turn: where the environment's turn-level rewards (a tool call that executed) "
               "are credited: unused (`outcome`), added to the trajectory's reward (`merged`), or as a turn-level "
               "advantage on the turns before the first reply (`mt_grpo`, `mt_grpo_cumulative`)",
               stage="advantage", default="outcome", neutral="outcome", metric="turn_credit/shift",
               supplied={"advantage_of": "the trainer: the advantage chain applied to a R^O + b R^T "
                                         "(train/rewards.py)"})

PAPER = "Zeng et al. 2025, arXiv 2505.11821; SiliangZeng/Multi-Turn-RL-Agent 7860de6 mt_grpo_env_trainer.py"


SINGLE_TURN = Inert(single_turn, "cannot act on a single-completion task: it has no turn-level reward",
                    "train a multi-turn task whose environment rewards turns (task=calculator)",
                    "a multi-turn task (task.max_turns)")


def _per_completion_estimator(cfg):
    """A turn reward's advantage is the estimator applied to R^T: it must be one from the group's own rewards
    (a critic's values, a greedy baseline or a baseline carried across steps are the outcome's)."""
    chosen = cfg.get("turn_credit")
    if chosen is None or chosen.name == "outcome":
        return None
    adv = option("adv", cfg.adv.name)
    if adv.uses_values or not adv.uses_group_statistic:
        return (f"turn_credit={chosen.name} needs an advantage estimator computed from the group's own rewards; "
                f"adv={cfg.adv.name} is not one (its baseline is the outcome's)")
    return None


@register("turn_credit", "outcome", what="the turn rewards are unused: every token gets the outcome's advantage")
def outcome_only(outcome_advantage, turn_reward, before_reply, replied, *, advantage_of=None):
    return outcome_advantage


@register("turn_credit", "merged",
          what="A(R^O + R^T): the turn rewards added to the trajectory's reward (the paper's GRPO-MR)",
          activity=Activity("turn_credit/shift"), inert=SINGLE_TURN, checks=(_per_completion_estimator,),
          tricks=(Trick("merged_turn_reward",
                        what="the turn rewards (a tool call that executed) added to the trajectory's reward: "
                             "MT-GRPO's GRPO-MR baseline",
                        source=PAPER, verdict="not_in_review"),))
def merged_reward(outcome_advantage, turn_reward, before_reply, replied, *, advantage_of=None):
    return advantage_of(1.0, 1.0)


@register("turn_credit", "mt_grpo",
          what="MT-GRPO: A(R^O) + c A(R^T) on the tokens before the first environment reply, A(R^O) after it; "
               "A(R^O + R^T) for an episode with no reply",
          knobs={"coef": NON_NEGATIVE},
          activity=Activity("turn_credit/shift"), inert=SINGLE_TURN, checks=(_per_completion_estimator,),
          tricks=(Trick("turn_level_credit",
                        what="MT-GRPO's turn-level advantage: the tool-calling turn gets its own group-normalized "
                             "turn reward's advantage beside the outcome's",
                        source=PAPER, verdict="not_in_review",
                        claims=(Claim("helps", "", "Zeng et al. 2025 (arXiv 2505.11821)",
                                      "turn-level credit beats trajectory-level GRPO with outcome or merged rewards: "
                                      "100% tool execution and 50% exact match against 20-30% on TriviaQA search"),)),))
def turn_level_advantage(outcome_advantage, turn_reward, before_reply, replied, *, advantage_of=None,
                         coef: float = 1.0):
    """[N, T]: the source's "aae" (additive) estimate, turn_advantage_coef = coef (an estimator's per-token
    advantages, OTB's, stay per token)."""
    turn, merged = _per_token(advantage_of(0.0, 1.0)), _per_token(advantage_of(1.0, 1.0))
    with_reply = _per_token(outcome_advantage) + coef * turn * before_reply.to(turn.dtype)
    return torch.where(replied[:, None], with_reply, merged)


@register("turn_credit", "mt_grpo_cumulative",
          what="MT-GRPO's cumulative estimate: A(R^T + gamma R^O) on the tokens before the first environment reply, "
               "A(R^O) after it; A(R^T + gamma R^O) for an episode with no reply",
          knobs={"gamma": FRACTION},
          activity=Activity("turn_credit/shift"), inert=SINGLE_TURN, checks=(_per_completion_estimator,))
def cumulative_turn_advantage(outcome_advantage, turn_reward, before_reply, replied, *, advantage_of=None,
                              gamma: float = 1.0):
    """[N, T]: the source's "cae" estimate, discount_factor = gamma: the turns before the reply see the turn
    reward and the discounted outcome as one return, the turns after it the outcome alone."""
    cumulative = _per_token(advantage_of(gamma, 1.0))
    before = before_reply.to(cumulative.dtype)
    with_reply = cumulative * before + _per_token(outcome_advantage) * (1 - before)
    return torch.where(replied[:, None], with_reply, cumulative)


def _per_token(advantages: torch.Tensor) -> torch.Tensor:
    """[N] or [N, T] -> broadcastable over a completion's tokens."""
    return advantages if advantages.dim() == 2 else advantages[:, None]
