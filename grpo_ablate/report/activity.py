"""Did a trick act? Its own activity metric, read from the runs that had it on.

Some tricks can only be seen to be inert after the runs: an adaptive controller whose target
the task never reaches never moves its coefficient, a filter that never fires drops nothing.
Each entry below is a metric that must show activity for the option to have changed the
run at all (a necessary condition): when it shows none in every run with the trick, the
contrast is *inert here*, whatever its Δ. The config-level rules (what cannot act before
anything runs) are in grpo_ablate/inert.py.
"""
from __future__ import annotations

NONZERO = "nonzero"       # the metric is nonzero at some step
CHANGES = "changes"       # the metric takes more than one value over the steps
ABOVE = "above"           # the metric exceeds a threshold at some step

# (family, option) -> (metric, kind, threshold)
ACTIVITY = {
    ("clip", "higher"): ("ppo/ratio_max", ABOVE, 1.2),      # differs from symmetric only past 1 + eps_low
    ("dual_clip", "enabled"): ("clip/dual_frac", NONZERO, None),
    ("overlong", "filter"): ("overlong/masked_frac", NONZERO, None),
    ("overlong", "soft_punish"): ("overlong/penalty_mean", NONZERO, None),
    ("sampling", "dynamic"): ("sampling/extra_generations", NONZERO, None),
    ("sampling", "dynamic_group"): ("sampling/extra_generations", NONZERO, None),
    ("adv_clip", "clip"): ("adv/clipped_frac", NONZERO, None),
    ("entropy", "bonus"): ("entropy/coef", NONZERO, None),
    ("entropy", "adaptive"): ("entropy/coef", NONZERO, None),
    ("kl", "adaptive"): ("kl/beta", CHANGES, None),
    ("kl", "adaptive_target"): ("kl/beta", CHANGES, None),
    ("kl", "two_layer"): ("kl/prev_k3", NONZERO, None),
    ("temperature", "learnable"): ("temperature/value", CHANGES, None),
    ("length", "penalty"): ("length/reward_mean", NONZERO, None),
    ("length", "group"): ("length/reward_mean", NONZERO, None),
    ("updates", "multi"): ("ppo/kl", NONZERO, None),
    ("updates", "mini_batches"): ("ppo/kl", NONZERO, None),
}


def shows_activity(values, kind: str, threshold) -> bool:
    """Whether a run's series of the metric (steps >= 1) shows the trick acting."""
    values = [v for v in values if v is not None and v == v]   # NaN is not activity
    if kind == NONZERO:
        return any(v != 0 for v in values)
    if kind == CHANGES:
        return len(set(values)) > 1
    return any(v > threshold for v in values)


def describe(metric: str, kind: str, threshold) -> str:
    """What 'no activity' means for the metric, in words."""
    return {NONZERO: f"{metric} stayed 0", CHANGES: f"{metric} never changed",
            ABOVE: f"{metric} never exceeded {threshold}"}[kind]
