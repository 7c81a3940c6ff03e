"""What a value may be: the one type every check of a user's value goes through.

A trick's knobs and its family's settings (tricks/registry.py), the run's own settings
(config/run_settings.py's RUN_SETTINGS), the fields of a sweep file and the command-line options
(values.py), the report's thresholds (report/health.py): each is an `Allowed`, and a value is
checked with `problem(value, given)`, which says in one line what was given and what is allowed.

    POSITIVE.problem(-1.0, "optim.lr=-1.0")  ->  "optim.lr=-1.0 is not allowed; it must be a number > 0"

Bounds may be config keys (`high="rollout.max_new_tokens"`), read from the composed config
when one is given. A setting's declaration also says what a run's identity (config/identity.py)
does with it: `resumable` (it may differ on resume: it changes how a run computes, not what) and
`neutral` (the value at which it does nothing: hashed only away from it, so a setting added at its
neutral value moves no recorded hash and every run recorded before it still resumes). This module
imports only the standard library, so the trick registry and the CLI's early checks can both use it
without importing anything heavy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

KINDS = ("number", "integer", "bool", "choice", "numbers", "weights", "text", "texts", "mapping", "families",
         "seeds", "any")


class _Hashed:
    """No neutral value: the setting enters the run's hash whatever its value."""

    def __repr__(self) -> str:
        return "HASHED"


HASHED = _Hashed()


@dataclass(frozen=True)
class ReadWhen:
    """A neutral that depends on another key of the same group: the setting does nothing, whatever its
    value, unless `key` is one of `values` (adv=gae's alpha is read by lam_fn=vapo alone)."""
    key: str
    values: tuple

    def reads(self, group: dict) -> bool:
        return group.get(self.key) in self.values


@dataclass(frozen=True)
class Allowed:
    """What a value may be. `low`/`high` are numbers or config keys; `choices` (kind choice: the
    allowed values; kind weights: the allowed names) may be a function that lists them when
    asked (a registry family's options); `optional`: null is allowed too; `note`: why, for the
    message."""
    kind: str = "number"   # number | integer | bool | choice | numbers (a list of numbers) | weights (name ->
                           # number) | text | texts (a list of texts) | mapping | families (config group or key
                           # -> a list of values or null) | seeds (a count, auto or a list) | any
    low: float | str | None = None
    high: float | str | None = None
    low_open: bool = False               # low < value (else low <= value)
    high_open: bool = False
    choices: tuple | Callable[[], tuple] = ()
    optional: bool = False
    note: str = ""
    length: int | None = None            # kind numbers: exactly this many (each in low..high)
    neutral: Any = HASHED                # the value at which the setting does nothing: hashed only away from it
                                         # (a ReadWhen: hashed only where another key makes it read)
    resumable: bool = False              # may differ between a run and its resumption (left out of the hash)
    unset: Any = None                    # what a config without the key means by it (an option of its group
                                         # that does not set it: rollout=vllm has no lean_decoder)
    read_when: ReadWhen | None = None    # a knob read only where another key of its group has one of some values:
                                         # set away from its default elsewhere, it is refused (a ReadWhen neutral too)

    def reader(self) -> ReadWhen | None:
        """The rule that says when the knob is read at all (None: always)."""
        return self.read_when or (self.neutral if isinstance(self.neutral, ReadWhen) else None)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Allowed kind {self.kind!r}; kinds: {', '.join(KINDS)}")

    def but(self, **changes) -> Allowed:
        """The same values with other fields: `POSITIVE_INT.but(resumable=True)`, `FLAG.but(neutral=True)`."""
        return replace(self, **changes)

    def problem(self, value, given: str, cfg=None) -> str | None:
        """None when `value` is allowed, else the one line that says so; `given`: how the user gave
        it (`optim.lr=-1.0`, `--jobs 0`)."""
        return None if self.ok(value, cfg) else f"{given} is not allowed; {self.words(cfg)}"

    def listed(self) -> tuple:
        return self.choices() if callable(self.choices) else self.choices

    def ok(self, value, cfg=None) -> bool:
        """Whether `value` is allowed (bounds given as config keys are read from `cfg`)."""
        if value is None:
            return self.optional
        if self.kind in ("any", "choice", "bool", "text", "texts", "mapping", "families", "seeds"):
            return _OF_KIND[self.kind](self, value)
        if self.kind == "weights":   # a dict, or omegaconf's DictConfig (not imported here)
            return hasattr(value, "items") and all(k in self.listed() and _finite(v) for k, v in value.items())
        if self.kind == "numbers":
            return (_is_list(value) and self.length in (None, len(value))
                    and all(_finite(v) and self._in_range(v, cfg) for v in value))
        if not _finite(value) or (self.kind == "integer" and not float(value).is_integer()):
            return False
        return self._in_range(value, cfg)

    def _in_range(self, value, cfg) -> bool:
        low, high = _bound(self.low, cfg), _bound(self.high, cfg)
        if low is not None and (value <= low if self.low_open else value < low):
            return False
        return high is None or not (value >= high if self.high_open else value > high)

    def words(self, cfg=None) -> str:
        """What the value must be, in words: 'it must be a number > 0', 'allowed: raw, centered'."""
        if self.kind in ("bool", "choice"):
            return "allowed: " + (", ".join(map(str, self.listed())) if self.kind == "choice" else "true, false")
        if self.kind == "weights":
            names = self.listed()
            return f"it must map names to numbers ({{{names[0]}: 2}}); names: {', '.join(names)}"
        numbers = "a list of numbers" if self.length is None else f"a list of {self.length} numbers"
        what = _WHAT.get(self.kind) or self._range({"number": "a number", "integer": "an integer",
                                                     "numbers": numbers}[self.kind], cfg)
        return f"it must be {what}" + (f" ({self.note})" if self.note else "")

    def _range(self, what: str, cfg) -> str:
        low, high = _bound(self.low, cfg), _bound(self.high, cfg)
        if self.low is not None and self.high is not None and self.kind == "integer" and not (
                self.low_open or self.high_open):
            return what + f" in {_show(self.low, low)}..{_show(self.high, high)}"
        if self.low is not None and self.high is not None:
            return what + (f" in {'(' if self.low_open else '['}{_show(self.low, low)}, "
                           f"{_show(self.high, high)}{')' if self.high_open else ']'}")
        if self.low is not None:
            return what + f" {'>' if self.low_open else '>='} {_show(self.low, low)}"
        if self.high is not None:
            return what + f" {'<' if self.high_open else '<='} {_show(self.high, high)}"
        return what


_OF_KIND = {
    "any": lambda allowed, value: True,
    "choice": lambda allowed, value: value in allowed.listed(),
    "bool": lambda allowed, value: isinstance(value, bool),
    "text": lambda allowed, value: isinstance(value, str),
    "texts": lambda allowed, value: _is_list(value) and all(isinstance(v, str) for v in value),
    "mapping": lambda allowed, value: hasattr(value, "items"),
    "families": lambda allowed, value: hasattr(value, "items") and all(
        isinstance(k, str) and (v is None or _is_list(v)) for k, v in value.items()),
    # a count, "auto" or a list of seeds: sweep's parse_seeds checks the rest
    "seeds": lambda allowed, value: isinstance(value, (int, str, list)) and not isinstance(value, bool),
}
_WHAT = {"text": "a text", "texts": "a list of texts", "mapping": "a mapping",
         "families": "a mapping of config groups or keys to a list of values (or null)",
         "seeds": "a seed count, auto or a list of seeds", "any": "anything"}


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_list(value) -> bool:
    return isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig"


def _bound(bound, cfg):
    """A bound's value: a number, or the value of a config key in `cfg` (None without a cfg, and where
    that key's own value is not a number: its own check names it, `staleness.max_age=abc`)."""
    if isinstance(bound, str):
        if cfg is None:
            return None
        node = cfg
        for part in bound.split("."):
            node = node[part]
        return node if _finite(node) else None
    return bound


def _show(bound, value) -> str:
    if isinstance(bound, str):
        return bound if value is None else f"{bound} ({value})"
    return f"{bound:g}"


# the ranges most values have
NUMBER = Allowed()
POSITIVE = Allowed(low=0, low_open=True)
NON_NEGATIVE = Allowed(low=0)
FRACTION = Allowed(low=0, high=1)
POSITIVE_INT = Allowed("integer", low=0, low_open=True)
FLAG = Allowed("bool")


def choice(*choices) -> Allowed:
    return Allowed("choice", choices=tuple(choices))
