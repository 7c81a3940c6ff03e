"""Family `optim_state`: what the optimizer keeps across steps (AdamW's moments).

Every option takes (optimizer) and acts on it in place; the trainer calls the option's plugin
(train/state/optim_state.py) after every optimizer step and after every rollout's update.

`none`: AdamW as it is, its moments carried across the whole run.
`reset`: AdamW's state (exp_avg, exp_avg_sq, step) dropped, so the next step starts from zero
moments at step 1, every optimizer step (`every: step`, slime `--use-stateless-adam`) or after
every rollout's update (`every: rollout`, slime `--reset-optimizer-states`).
"""
from __future__ import annotations

from grpo_ablate.tricks.registry import Activity, Trick, choice, declare_family, register

declare_family("optim_state", "AdamW's moments kept, or reset after every optimizer step (slime stateless Adam) "
               "or every rollout (slime --reset-optimizer-states)", stage="optimizer", metric="optim/state_resets")


@register("optim_state", "none",
          what="AdamW's moments carried across the whole run")
def keep_optimizer_state(optimizer) -> None:
    """AdamW's moments carried across the run."""


@register("optim_state", "reset",
          what="slime: AdamW's moments reset after every optimizer step (--use-stateless-adam) or every rollout "
               "(--reset-optimizer-states)",
          notes={"every": "step (stateless Adam) | rollout (reset optimizer states)"},
          resets_optimizer=True,
          knobs={"every": choice("step", "rollout")},
          activity=Activity("optim/state_resets"),
          tricks=(Trick("stateless_adam",
                        what="Adam without moments across steps: each step is Adam's first, -lr g / (|g| + eps)",
                        source="slime --use-stateless-adam (slime/backends/megatron_utils/stateless_adam.py)",
                        verdict="not_in_review", settings={"every": "step"}),
                  Trick("reset_optimizer_states",
                        what="Adam's moments reset after every rollout (kept across its mini-batch steps)",
                        source="slime --reset-optimizer-states (slime/backends/megatron_utils/model.py)",
                        verdict="not_in_review", settings={"every": "rollout"})))
def reset_optimizer_state(optimizer, *, every: str = "step") -> None:
    """Drop the optimizer's per-parameter state (AdamW: exp_avg, exp_avg_sq, step): its next step
    initializes them to zero with step 1, so with bias correction m_hat = g, v_hat = g^2 and the
    update is -lr g / (|g| + eps) (after AdamW's decoupled decay p <- p (1 - lr wd)).

    `every: step`: after every optimizer step (the trainer's plugin calls it then). slime's
    `StatelessAdam` (commit 624b824) computes exactly that update without keeping the moments
    (bias_correction on, adam_w_mode: decoupled decay); it refuses amsgrad, as AdamW here has none.
    `every: rollout`: after every rollout's optimizer steps; slime `--reset-optimizer-states`
    zeroes exp_avg, exp_avg_sq and step at the start of every rollout's training, the same
    moments for the steps within a rollout (mini-batches, epochs) and none carried to the next.
    With one optimizer step per rollout the two are the same. Differences: slime keeps the
    zeroed tensors allocated; here they are dropped and made again (the same numbers). The
    learning-rate schedule is not reset (nor is it in slime). No config leaves it nothing to do:
    every run's optimizer is AdamW.
    """
    if every not in ("step", "rollout"):
        raise ValueError(f"optim_state.every={every!r} is not allowed; allowed: step, rollout")
    optimizer.state.clear()
