"""Family `dual_clip`: dual-clip PPO (verl `clip_ratio_c`, default 3; DAPO's script uses 10).

For A < 0 the objective becomes max(min(rho A, clip(rho) A), c A), i.e. the loss is capped
at -c A, so a token with rho > c and A < 0 gets no gradient. TRL's two-sided `delta`
(INTELLECT-2) is the same cap: min(rho, delta) on the unclipped branch = dual clip, c = delta.
Config only: the PPO-clip loss (tricks/clip/ratio.py `ppo_clip_loss`) takes dual_clip.c as its
supplied knob dual_clip_c.
"""
from __future__ import annotations

from grpo_ablate.tricks.conditions import one_optimizer_step
from grpo_ablate.tricks.registry import Activity, Allowed, Inert, Trick, declare, declare_family, option

declare_family("dual_clip", "dual-clip PPO for A < 0, c = 3", stage="loss", metric="clip/dual_frac",
               settings={"c": Allowed(low=1, low_open=True, optional=True,   # handed to the policy loss as dual_clip_c
                                   note="the loss of a negative-advantage token is capped at -c A")})


def _caps_a_ppo_clip_loss(cfg):
    if "dual_clip_c" in option("clip", cfg.clip.name).knobs:
        return None
    return (f"dual_clip={cfg.dual_clip.name} caps the PPO-clip loss, and clip={cfg.clip.name} has no dual clip; "
            "use clip=symmetric or clip=higher, or dual_clip=none")


declare("dual_clip", "none")
declare("dual_clip", "enabled", off_policy_only=True,   # caps rho A: rho == 1 never hits it
        activity=Activity("clip/dual_frac"), checks=_caps_a_ppo_clip_loss,
        inert=Inert(one_optimizer_step, "cannot act with one optimizer step per rollout (ρ ≡ 1 never exceeds c)",
                    "add updates.mini_batches=4", "several optimizer steps per rollout"),
        tricks=(Trick("dual_clip",
                      what="dual-clip PPO, c 3",
                      source="verl clip_ratio_c",
                      verdict="not_applicable"),))
