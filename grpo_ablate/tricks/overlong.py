"""Family `overlong`: what happens to truncated completions (no EOS within max_new_tokens).

Every option takes (rewards [N], lengths [N], truncated [N] bool, group_index [N], correct [N]
bool: the verifier's success, max_len) and returns (rewards, keep, penalty): `keep` [N] is False for completions whose
tokens must get no gradient, `penalty` [N] is what was added to the reward.

`filter` (DAPO overlong filtering; TRL `mask_truncated_completions`): a truncated completion
keeps its reward in the group statistics, but its tokens are masked out (no gradient, not
counted by token_mean).
`soft_punish` (DAPO soft overlong punishment; TRL `get_soft_overlong_punishment`, verl DAPO
reward manager): with L = max_new_tokens, buffer L_c and factor f,
    R_len = 0                       if |o| <= L - L_c
          = f ((L - L_c) - |o|) / L_c   if L - L_c < |o| <= L
          = -f                      beyond,
added to the task reward. PipelineRL's difficulty-aware penalty is its knob `gamma`.
`stop_properly` (NeMo-RL's stop-properly penalty; OpenRLHF `--stop_properly_penalty_coef`): a
truncated completion's reward is scaled, R' = c R (c = 0: it scores zero), its tokens trained.

On a multi-turn task `truncated` is the episode's flag (sampling/multi_turn.py): a turn cut by the
per-turn budget or the trajectory cut by rollout.max_new_tokens, which ends the episode there (miles
d583c2ae2, #2587: nothing past a length-truncated turn is kept). So `none` keeps the episode's reward,
`stop_properly` scores it zero and `filter` masks the whole episode (its replies too) out of the loss.
`lengths` are the trained tokens (train/rewards.py: the policy's under env_mask=masked), while
rollout.max_new_tokens also counts the replies: `soft_punish` ramps over the policy's tokens only.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import (DAPO, FRACTION, NON_NEGATIVE, Activity, Claim, Allowed, Inert, Trick,
                                         declare_family, register)

declare_family("overlong", "truncated completions: masked out, or a DAPO length penalty", stage="reward",
               metric="overlong/penalty_mean")


def soft_overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0):
    """DAPO's length penalty R_len(|o|) (0 inside the budget minus the buffer, down to -factor)."""
    start = max_len - buffer
    ramp = factor * (start - lengths) / buffer
    return torch.where(lengths <= start, torch.zeros_like(ramp),
                       torch.where(lengths <= max_len, ramp, torch.full_like(ramp, -factor)))


@register("overlong", "none")
def no_overlong(rewards, lengths, truncated, group_index, correct, max_len):
    return rewards, torch.ones_like(truncated, dtype=torch.bool), torch.zeros_like(rewards)


@register("overlong", "filter",
          what="DAPO overlong filtering: truncated completions keep their reward, their tokens get no gradient",
          activity=Activity("overlong/masked_frac"),
          tricks=(Trick("overlong_filter",
                        what="mask truncated completions out of the loss",
                        source="TRL mask_truncated_completions",
                        verdict="not_applicable",
                        claims=(
                            Claim("helps", "model=base", DAPO,
                                  "masking truncated completions (overlong filtering) steadies training"),)),))
def overlong_filter(rewards, lengths, truncated, group_index, correct, max_len):
    return rewards, ~truncated, torch.zeros_like(rewards)


@register("overlong", "stop_properly",
          what="the stop-properly penalty: a truncated completion's reward scaled by `coef` (0: it scores zero), "
               "its tokens still trained",
          notes={"coef": "NeMo-RL's ProRL example and OpenRLHF's examples set 0.0: a truncated completion scores 0"},
          shapes_reward=True,
          knobs={"coef": FRACTION},
          activity=Activity("overlong/penalty_mean"),
          inert=Inert(lambda cfg: float(cfg.overlong.coef) == 1, "cannot act with overlong.coef=1 (every reward "
                      "is kept)", "set overlong.coef < 1 (0.0)", "overlong.coef < 1"),
          tricks=(Trick("stop_properly_penalty",
                        what="a truncated completion (a multi-turn episode cut by a token budget) scores zero",
                        source="NeMo-RL 177abd560 nemo_rl/algorithms/reward_functions.py "
                               "(stop_properly_penalty_coef); OpenRLHF --stop_properly_penalty_coef",
                        verdict="not_in_review"),))
def overlong_stop_properly(rewards, lengths, truncated, group_index, correct, max_len, *, coef: float = 0.0):
    """R'_i = coef * R_i if o_i is truncated, R_i otherwise (NeMo-RL apply_reward_shaping, read at
    NVIDIA-NeMo/RL 177abd560: `torch.where(truncated, rewards * coef, rewards)`, coef in [0, 1]).
    It scales the reward rather than setting it to reward.wrong, as NeMo-RL does: on the 0/1 scale
    coef=0 is "wrong"; on a -1/1 scale a truncated failure rises to 0. The penalty is R' - R.
    Difference: OpenRLHF also takes coef < 0 as the reward itself; here coef is in [0, 1] (NeMo-RL's)."""
    shaped = torch.where(truncated, rewards * coef, rewards)
    return shaped, torch.ones_like(truncated, dtype=torch.bool), shaped - rewards


def solve_rates(correct: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """[N] the fraction of each row's group that the verifier accepted."""
    n_groups = int(group_index.max()) + 1 if group_index.numel() else 0
    solved = torch.zeros(n_groups, dtype=torch.float64, device=correct.device).index_add_(
        0, group_index, correct.to(torch.float64))
    return (solved / torch.bincount(group_index, minlength=n_groups).clamp(min=1))[group_index]


@register("overlong", "soft_punish",
          what="DAPO soft overlong punishment: a length penalty ramping to -factor over the last `buffer` tokens",
          defaults={"buffer": 4},
          notes={"buffer": "L_c (DAPO: 4096 of 20480, 20% of the budget): 20% of the 18-token budget of",
                 "gamma": "PipelineRL difficulty_aware_penalty: a success's penalty x solve_rate^gamma (0: DAPO)",
                 "failure_scale": "PipelineRL: a failure's penalty x failure_scale"},
          shapes_reward=True,
          knobs={"buffer": Allowed("integer", low=1, high="rollout.max_new_tokens"), "factor": NON_NEGATIVE,
                 "gamma": NON_NEGATIVE, "failure_scale": FRACTION},
          activity=Activity("overlong/penalty_mean"),
          inert=Inert(lambda cfg: float(cfg.overlong.factor) == 0, "cannot act with overlong.factor=0 (the penalty "
                      "is 0 at every length)", "set overlong.factor > 0 (1.0)", "overlong.factor > 0"),
          checks=lambda cfg: ("overlong.gamma > 0 scales a success's penalty by its group's solve rate, which a "
                              "group of one has not: rollout.group_size >= 2"
                              if float(cfg.overlong.get("gamma") or 0) > 0 and cfg.rollout.group_size == 1 else None),
          tricks=(Trick("overlong_punish",
                        what="DAPO soft overlong punishment",
                        source="verl DAPO reward manager; TRL get_soft_overlong_punishment",
                        verdict="not_applicable",
                        claims=(
                            Claim("helps", "model=base", DAPO,
                                  "soft overlong punishment reduces reward noise from truncation and steadies "
                                  "training: one of DAPO's four techniques"),)),
                  Trick("difficulty_aware_penalty",
                        what="the soft overlong penalty of a success scaled by its group's solve rate^gamma; "
                             "failures keep it whole",
                        source="PipelineRL actor.difficulty_aware_penalty (gamma, failure_scale)",
                        verdict="not_in_review", settings={"gamma": 1.0, "failure_scale": 1.0})))
def overlong_soft_punish(rewards, lengths, truncated, group_index, correct, max_len, *, buffer: int = 4096,
                         factor: float = 1.0, gamma: float = 0.0, failure_scale: float = 1.0):
    """DAPO's soft overlong punishment (module docstring), and PipelineRL's difficulty-aware form:

        penalty_i = R_len(|o_i|) * s_i,   s_i = p_g^gamma   if o_i was solved and not truncated
                                              = 1             if o_i was solved but truncated
                                              = failure_scale otherwise

    p_g is the fraction of o_i's group that was solved: on a hard prompt (few successes) a
    success that needed length pays little; failures keep the full penalty. gamma = 0 (and
    failure_scale = 1) is DAPO's penalty unchanged (0^0 = 1, as Python's). Reference:
    PipelineRL pipelinerl/actor.py (difficulty-aware length penalty; commit 58d3934),
    `length_penalty` in pipelinerl/domains/math/rollouts.py (the DAPO ramp with factor 1, 0 past
    max_tokens). Difference: PipelineRL's "hard cap guard" asks for output_tokens >= max_tokens
    and not finished; here that is `truncated`. Its success is the domain's `metrics.success`;
    here the verifier's score > 0 (`correct`), as the `length` family reads it.
    """
    if not 0 < buffer <= max_len:
        raise ValueError(f"overlong.buffer={buffer} is not allowed; it must be in 1..max_new_tokens ({max_len})")
    penalty = soft_overlong_penalty(lengths.to(rewards.dtype), max_len, buffer, factor)
    if gamma != 0 or failure_scale != 1:
        success = solve_rates(correct, group_index).to(rewards.dtype) ** gamma
        scale = torch.where(correct & ~truncated, success, torch.ones_like(success))
        penalty = penalty * torch.where(correct, scale, torch.full_like(scale, failure_scale))
    return rewards + penalty, torch.ones_like(truncated, dtype=torch.bool), penalty

