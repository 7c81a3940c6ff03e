"""Family `env_mask`: whether the environment's tokens of a multi-turn episode are trained on.

A multi-turn completion interleaves the policy's turns with the environment's replies (a tool's
result, a user's message), all of them token ids in one sequence (sampling/multi_turn.py). Every
option takes (completion_mask [N, T], sampled [N, T] or None: 1 on the tokens the policy sampled)
and returns the mask of the tokens the run trains on [N, T]; the trainer builds its one mask from
it (train/rewards.py), so the loss (every loss_agg's weights and normalizer), the KL, the entropy,
the importance ratios and the length and overlong families all read the same tokens.

    masked     m_t = c_t * s_t    only what the policy sampled (verl's response_mask, TRL's tool mask)
    unmasked   m_t = c_t          the environment's reply trained as if the policy had sampled it

(The options are not named on/off: YAML 1.1 reads those as booleans in a defaults list.)
`unmasked` reproduces the bug that ms-swift fixed in cf6316ca2 (#9923: the loss scaled over tool
messages) and slime's #1370 (KL accumulated over tool-response tokens): with token_mean,
    L_unmasked = - sum_t c_t A r_t / sum_t c_t,    L_masked = - sum_t c_t s_t A r_t / sum_t c_t s_t,
so `unmasked` adds a gradient A * grad log pi(reply token) that pushes the policy towards predicting
the tool's output (or away from it when A < 0) and dilutes the policy tokens' weight by the
reply's share of the tokens. On a single-completion task there is no environment token (s is
None): both options return c, and the family is inert.
"""
from __future__ import annotations

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.conditions import single_turn_task
from grpo_ablate.tricks.registry import Activity, Claim, Inert, Trick, declare_family, register

declare_family("env_mask", "multi-turn: the environment's tokens (tool replies) masked out of every term "
               "(`masked`), or trained on as if sampled (`unmasked`: ms-swift's and slime's bug, to measure it)",
               stage="reward", default="masked", neutral="masked", metric="env_mask/env_token_frac")


@register("env_mask", "masked",
          what="train only the tokens the policy sampled: the environment's replies are masked out of every term")
def sampled_tokens_only(completion_mask: torch.Tensor, sampled: torch.Tensor | None) -> torch.Tensor:
    return completion_mask if sampled is None else completion_mask * sampled.to(completion_mask.dtype)


@register("env_mask", "unmasked",
          what="train the environment's reply tokens as if the policy had sampled them (the bug, to measure it)",
          activity=Activity("env_mask/env_token_frac"),
          inert=Inert(single_turn_task, "cannot act on a single-completion task: it has no environment token",
                      "train a multi-turn task (task=calculator)", "a multi-turn task (task.max_turns)"),
          tricks=(Trick("train_env_tokens",
                        what="train on the tool's reply tokens too (the environment-token masking bug)",
                        source="ms-swift cf6316ca2 (#9923); slime #1370",
                        verdict="not_in_review",
                        claims=(Claim("hurts", "", "ms-swift #9923",
                                      "scaling the loss over tool messages trains the policy on text it did not "
                                      "write; fixed by masking them"),)),))
def every_completion_token(completion_mask: torch.Tensor, sampled: torch.Tensor | None) -> torch.Tensor:
    return completion_mask
