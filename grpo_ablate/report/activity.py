"""Did a trick act? Its own activity metric, read from the runs that had it on.

Some tricks can only be seen to be inert after the runs: an adaptive controller whose target
the task never reaches never moves its coefficient, a filter that never fires drops nothing.
Each option's activity metric (registered with it in grpo_ablate/tricks/) must show activity
for the option to have changed the run at all (a necessary condition): when it shows none in
every run with the trick, the contrast is *inert here*, whatever its Δ. The config-level rules
(what cannot act before anything runs) are registered with the options too (grpo_ablate/config/inert.py).
"""
from __future__ import annotations

from grpo_ablate import tricks  # noqa: F401  every option registered: their activity metrics are read below
from grpo_ablate.tricks.registry import UnknownOption, option

NONZERO = "nonzero"       # the metric is nonzero at some step
CHANGES = "changes"       # the metric takes more than one value over the steps
ABOVE = "above"           # the metric exceeds a threshold at some step



def activity_of(family, name) -> tuple | None:
    """(metric, kind, threshold) of the option's activity metric, as registered with it (registry.Activity;
    the registry and the trick modules import no torch), or None: no such option, or none registered."""
    try:
        found = option(family, name)
    except UnknownOption:
        return None
    return None if found.activity is None else (found.activity.metric, found.activity.kind, found.activity.threshold)


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
