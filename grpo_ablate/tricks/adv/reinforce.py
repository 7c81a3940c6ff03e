"""Family `adv`, REINFORCE against a baseline that is not the group's: the reward of the policy's own
greedy completion of the prompt (ReMax, flag `greedy_baseline`), or an EMA of the rewards carried across
steps (prime-rl's RAE, flag `carries_baseline`: the trainer keeps and checkpoints it).
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import Activity, Allowed, Trick, register


def _remax_cannot_take(cfg):
    """The greedy baseline is on the task's reward scale, given only to the whole batch's chain."""
    if cfg.reward_norm.name != "none":
        return "adv=remax subtracts the greedy completion's raw reward: use reward_norm=none"
    if cfg.diag.grad_conflict:
        return "adv=remax needs its greedy baseline, which the gradient diagnostics' components have not"
    return None


@register("adv", "remax",
          what="ReMax (verl adv_estimator=remax): A = r - the reward of the policy's greedy completion of the prompt",
          greedy_baseline=True, checks=_remax_cannot_take,
          tricks=(Trick("remax",
                        what="ReMax: A = r - r(greedy completion of the same prompt), no std",
                        source="verl adv_estimator=remax (core_algos compute_remax_outcome_advantage; arXiv "
                               "2310.10505)",
                        verdict="not_in_review", cost="one greedy generation per prompt per step"),))
def remax_advantage(rewards, group_index, mask, values, components):
    """ReMax (Li et al. 2023, arXiv 2310.10505): REINFORCE with the reward of the policy's own
    greedy completion of the prompt as the baseline.

        A_j = r_j - b_p(j),   b_p = reward(greedy completion of prompt p)

    `values` carries b per row ([N]: the trainer samples one greedy completion per prompt for an
    estimator with the `greedy_baseline` flag, and maps its verifier score to the reward scale).
    Reference: verl `compute_remax_outcome_advantage` (adv_estimator=remax: the reward-to-go of
    the token-level rewards minus `reward_baselines`, which for an outcome reward is r - b on
    every token; its trainer generates the baseline with do_sample=False and scores it with the
    same reward function). Difference: the baseline here is the verifier's score only (the shaping
    tricks -- length, overlong, format -- are not applied to it).
    """
    return rewards - values.to(rewards.dtype)


def ema_baselines(rewards: torch.Tensor, start: float, decay: float) -> tuple[torch.Tensor, float]:
    """([N] the baseline each row is scored against, the baseline after the last row): rows in order,
    each against the EMA before its own reward moves it, b <- decay b + (1 - decay) r."""
    before, b = [], float(start)
    for r in rewards.tolist():
        before.append(b)
        b = decay * b + (1.0 - decay) * r
    return torch.tensor(before, dtype=rewards.dtype, device=rewards.device), b


def _rae_cannot_take(cfg):
    if cfg.diag.grad_conflict:
        return ("adv=rae reads its EMA baseline, which the gradient diagnostics' per-component advantages have not: "
                "use diag.grad_conflict=false")
    return None


@register("adv", "rae",
          what="RAE (prime-rl algo.type=rae; SPIRAL arXiv 2506.24119): A = r - an EMA of the rewards seen so far",
          notes={"decay": "prime-rl RAEAlgoConfig.decay: b <- decay b + (1 - decay) r"},
          carries_baseline=True,
          knobs={"decay": Allowed(low=0, high=1, high_open=True)},
          activity=Activity("adv/ema_baseline", "changes"), checks=_rae_cannot_take,
          writes=("adv/std", "adv/ema_baseline"),
          tricks=(Trick("rae",
                        what="REINFORCE against an EMA of the rewards seen so far (per agent; one agent here)",
                        source="prime-rl algo.type=rae (SPIRAL role-conditioned advantage estimation, arXiv "
                               "2506.24119)",
                        verdict="not_in_review"),))
def rae_advantage(rewards, group_index, mask, values, components, *, decay: float = 0.95):
    """RAE (SPIRAL, arXiv 2506.24119), prime-rl's form: A_j = r_j - b_j, where b is an exponential
    moving average of the rewards, b <- decay b + (1 - decay) r, updated trace by trace after the
    trace is scored (the unbiased order), starting at 0 and carried across steps.

    `values` carries b before this batch ([1]; the trainer's plugin keeps it, train/state/adv.py,
    and moves it with the same scan once the advantages are taken). Reference: prime-rl
    src/prime_rl/orchestrator/algo/rae.py `RAEAlgorithm.score_group` and RAEAlgoConfig (decay 0.95,
    in [0, 1)), commit 559b447. prime-rl keys a baseline per (env, agent) for multi-agent
    self-play; a single-agent task has one, as here. Differences: prime-rl scores groups in the order
    they finish (asynchronously); here the batch's rows in order. Its baselines live in memory
    (a restart re-warms them); here the baseline is checkpointed. No group statistic: any group size.
    """
    start = float(values.reshape(-1)[0]) if values is not None else 0.0
    return rewards - ema_baselines(rewards, start, float(decay))[0]
