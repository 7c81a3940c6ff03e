"""From the verifier's scores to advantages: reward shaping, then the advantage chain.

The trained tokens come first: `env_mask` makes them from the completion mask and the tokens the
policy sampled (a multi-turn episode holds the environment's replies too), and every length below
is counted over them, so the length and overlong families read what the loss trains on.
Shaping, in order (each family a trick, looked up in the registry):
    task      the verifier's score mapped to [reward.wrong, reward.correct]
    format    task.format_reward for an answer in \\boxed{} / after #### (real tasks)
    overlong  `overlong`: a soft punishment added, or truncated completions masked out
    length    `length`: a length penalty or the group length reward added
    kl        `kl=in_reward`: - beta * sum_t KL_t(pi_old, pi_ref) per completion (kl.estimator)
The parts are kept by name (`components`, summing to the total): an estimator that reads
them (adv=gdpo: each part normalized in its group) gets them, and the gradient diagnostics
push each one alone through the same advantage chain, reward_norm -> adv -> adv_clip, as
the total goes through.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from grpo_ablate.config.spec import BoundOption, RewardScale
from grpo_ablate.tricks.adv.critic import critic_returns
from grpo_ablate.tricks.kl import kl_reward_penalty


@dataclass
class ShapedRewards:
    rewards: torch.Tensor            # [N] the total that the advantage is computed from
    components: dict                 # name -> [N] its parts (task, format, overlong, length, kl)
    keep: torch.Tensor               # [N] bool: False for completions whose tokens are masked out
    mask: torch.Tensor               # [N, T] the trained tokens: completion tokens of kept rows


class RewardShaping:
    """The shaping tricks of a run, bound once: (scores, completions) -> ShapedRewards.
    `tricks`: the run's bound options by family; shaping reads overlong, length and kl.estimator."""

    def __init__(self, tricks: Mapping[str, BoundOption], scale: RewardScale, max_new_tokens: int, task,
                 reward_beta: float):
        self.correct, self.wrong = scale.correct, scale.wrong
        self.format_reward = float(getattr(task, "format_reward", 0.0))   # bonus for \boxed{} / ####
        self.formatted = getattr(task, "formatted", None)
        self.overlong, self.length = tricks["overlong"].fn, tricks["length"].fn
        self.env_mask = tricks["env_mask"].fn   # which completion tokens are trained (multi-turn)
        self.max_new = max_new_tokens
        self.reward_beta = reward_beta
        self.kl_estimator = tricks["kl.estimator"].fn   # kl=in_reward's KL_t

    def __call__(self, scores, texts, roll, group_index, old_logp=None, ref_logp=None) -> ShapedRewards:
        task = self.wrong + (self.correct - self.wrong) * scores   # the verifier's score on the reward scale
        rewards, formatted = task, {}
        if self.format_reward:
            formatted["format_reward"] = self.format_reward * torch.tensor(
                [float(self.formatted(t)) for t in texts], device=rewards.device)
            rewards = rewards + formatted["format_reward"]
        trained = self.env_mask(roll.completion_mask, roll.sampled)   # [N, T] single-turn: the completion mask
        lengths = trained.sum(dim=1)
        rewards, keep, overlong_penalty = self.overlong(rewards, lengths, roll.truncated, group_index, scores > 0,
                                                        self.max_new)
        mask = trained * keep[:, None]   # [N, T] 1 up to and incl. EOS, if trained
        rewards, length_reward = self.length(rewards, lengths, group_index, scores > 0, self.max_new)
        components = {"task_reward": task, "overlong_reward": overlong_penalty, "length_reward": length_reward,
                      **formatted}
        if self.reward_beta > 0:
            kl_reward = -self.reward_beta * kl_reward_penalty(old_logp, ref_logp, mask, self.kl_estimator)
            rewards = rewards + kl_reward
            components["kl_reward"] = kl_reward
        return ShapedRewards(rewards, components, keep, mask)


@dataclass
class Advantages:
    values: torch.Tensor           # [N] per completion, or [N, T] per token (an estimator with a critic)
    clipped_frac: torch.Tensor     # the fraction adv_clip clipped
    rewards: torch.Tensor          # [N] the rewards after reward_norm, which the estimator saw
    outcome: torch.Tensor | None = None   # the outcome reward's advantages before turn_credit (None: no turn rewards)

    @property
    def per_token(self) -> torch.Tensor:
        """Broadcastable over a completion's tokens: [N, 1] or [N, T]."""
        return self.values if self.values.dim() == 2 else self.values[:, None]


@dataclass
class TurnRewards:
    """A multi-turn batch's turn-level rewards, as the turn_credit family reads them."""
    rewards: torch.Tensor          # [N] the episode's summed turn rewards (Reply.reward)
    before_reply: torch.Tensor     # [N, T] 1 on the completion positions before its first environment token
    replied: torch.Tensor          # [N] bool: the episode has an environment token

    @classmethod
    def of(cls, roll, device) -> "TurnRewards | None":
        """None for single completions (no turn reward)."""
        if roll.turn_reward is None:
            return None
        env = (roll.completion_mask * (1 - roll.sampled)).to(device) > 0
        replied, width = env.any(dim=1), env.shape[1]
        first = torch.where(replied, env.to(torch.int64).argmax(dim=1),
                            torch.full_like(replied, width, dtype=torch.int64))
        before = (torch.arange(width, device=device)[None, :] < first[:, None]).to(roll.completion_mask.dtype)
        return cls(roll.turn_reward.to(device), before, replied)


class AdvantageChain:
    """reward_norm -> adv -> adv_clip, bound once; the same chain for the total reward and for
    each reward component alone (the diagnostics); then turn_credit, where a multi-turn batch's
    turns carry rewards of their own (each reward it reads goes through the whole chain)."""

    def __init__(self, tricks: Mapping[str, BoundOption]):
        adv = tricks["adv"]
        self.reward_norm, self.estimator, self.adv_clip = tricks["reward_norm"].fn, adv.fn, tricks["adv_clip"].fn
        self.critic_knobs = dict(adv.knobs)   # adv=gae's: gamma, lam and its lambda schedule's knobs
        self.reads_turns = adv.has("reads_turn_index")   # the estimator takes each token's turn (adv=gae)
        self.turn_credit = tricks["turn_credit"].fn

    def __call__(self, rewards, group_index, mask, values=None, components=None, turns: TurnRewards | None = None,
                 turn_index=None) -> Advantages:
        """`components`: the reward's parts by name (ShapedRewards.components), for an estimator
        that normalizes each (gdpo); None or {}: the reward is one part. They are the raw parts:
        reward_norm maps the total, and a per-group normalization ignores its scale anyway.
        `turns`: the episodes' turn rewards (None: single completions, or no turn credit to give);
        `turn_index` [N, T]: the rollout's turn of each token (None: a single-turn task), for an
        estimator that reads it."""
        components = components or {}
        outcome = self.chain(rewards, group_index, mask, values, components, turn_index)
        if turns is None:
            return outcome

        def advantage_of(a: float, b: float) -> torch.Tensor:
            """The chain's advantages of a R^O + b R^T, its parts scaled alike."""
            parts = ({**{k: a * v for k, v in components.items()}, "turn_reward": b * turns.rewards}
                     if components else {})
            return self.chain(a * rewards + b * turns.rewards, group_index, mask, values, parts, turn_index).values

        credited = self.turn_credit(outcome.values, turns.rewards, turns.before_reply, turns.replied,
                                    advantage_of=advantage_of)
        return Advantages(credited, outcome.clipped_frac, outcome.rewards, outcome=outcome.values)

    def chain(self, rewards, group_index, mask, values, components, turn_index=None) -> Advantages:
        rewards = self.reward_norm(rewards)
        turns = {"turn_index": _on(turn_index, mask)} if self.reads_turns else {}
        advantages, clipped_frac = self.adv_clip(self.estimator(rewards, group_index, mask, values, components,
                                                                **turns))
        return Advantages(advantages, clipped_frac, rewards)

    def critic_returns(self, rewards, mask, old_values, turn_index=None):
        """The critic's targets: lambda-returns of the (reward_norm'ed) reward under V_old, with the
        estimator's own lambda (per sample too) and timestep (turns: `turn_index`)."""
        return critic_returns(rewards, mask, old_values, _on(turn_index, mask), **self.critic_knobs)


def _on(turn_index, mask):
    """The turn index on the mask's device (the rollout's tensors stay where they were sampled)."""
    return None if turn_index is None else turn_index.to(mask.device)
