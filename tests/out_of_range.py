"""Values outside an `Allowed`, as a user would type them on the command line (Hydra's grammar),
derived from the declaration alone: below its low, above its high, the wrong type, a non-choice,
not a bool, a non-finite number. tests/test_run_settings.py sends each through `grpo-ablate train`."""
from __future__ import annotations

from grpo_ablate.allowed import Allowed


def out_of_range(allowed: Allowed) -> list[str]:
    """Override values that `allowed` refuses (none for a kind that takes anything, or a bound
    that is a config key: that bound is read from the composed config, not known here)."""
    if allowed.kind in ("number", "integer"):
        return _outside_bounds(allowed) + ["abc", "true"] + (["nan", "inf", "-inf"] if allowed.kind == "number"
                                                               else ["2.5"])
    if allowed.kind == "numbers":
        inside = _inside(allowed)
        bad = ["abc", f"[{inside},abc]"]
        bad += [f"[{','.join([v] * (allowed.length or 1))}]" for v in _outside_bounds(allowed)]
        return bad + ([f"[{','.join([inside] * (allowed.length + 1))}]"] if allowed.length else [])
    if allowed.kind == "bool":
        return ["maybe", "1"]
    if allowed.kind == "choice":
        return ["not_a_choice"]
    if allowed.kind in ("text", "texts"):
        return ["5"]
    if allowed.kind == "weights":
        return ["{not_a_name: 1}"]
    return []   # any, mapping, families, seeds: nothing to refuse from the declaration alone


def _outside_bounds(allowed: Allowed) -> list[str]:
    values = []
    if isinstance(allowed.low, (int, float)):
        values.append(allowed.low if allowed.low_open else allowed.low - 1)
    if isinstance(allowed.high, (int, float)):
        values.append(allowed.high if allowed.high_open else allowed.high + 1)
    return [f"{v:g}" for v in values]


def _inside(allowed: Allowed) -> str:
    """A value the bounds allow (for a list that is wrong in another way)."""
    low = allowed.low if isinstance(allowed.low, (int, float)) else None
    high = allowed.high if isinstance(allowed.high, (int, float)) else None
    if low is not None and high is not None:
        return f"{(low + high) / 2:g}"
    return f"{(low or 0) + 1:g}" if high is None else f"{high - 1:g}"
