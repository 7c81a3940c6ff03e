"""The values a user gives outside the Hydra config: command-line options and sweep-file fields.

One table says what each may be, and one function checks a value against it, so that a bad
one is one line naming what is allowed. This module imports only the standard library and
PyYAML: `sweep` and `doctor` check their options here before the training stack is imported
(a wrong `--jobs 0` is refused in well under a second). The Hydra config's values are checked
in config.py; the trick knobs' types and ranges come from the trick registry.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from grpo_ablate.errors import UserError


class ValueProblem(UserError, ValueError):
    """A user value that is not allowed: the message is the one line the user sees."""


@dataclass(frozen=True)
class Allowed:
    """What a value may be. kind: integer | number | text | bool | texts (a list of texts) | mapping |
    families (a mapping of a config group or key to a list of values or null) | seeds | any;
    `low`/`high` bound numbers (`low_open`: low < value); null is always allowed (= the default)."""
    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    note: str = ""

    def ok(self, value) -> bool:
        if value is None or self.kind == "any":
            return True
        if self.kind == "seeds":   # a count, "auto" or a list of seeds: parse_seeds checks the rest
            return isinstance(value, (int, str, list)) and not isinstance(value, bool)
        if self.kind in ("integer", "number"):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return False
            if self.kind == "integer" and not float(value).is_integer():
                return False
            if self.low is not None and (value <= self.low if self.low_open else value < self.low):
                return False
            return self.high is None or value <= self.high
        if self.kind == "texts":
            return isinstance(value, list) and all(isinstance(v, str) for v in value)
        if self.kind == "families":
            return isinstance(value, dict) and all(isinstance(k, str) and (v is None or isinstance(v, list))
                                                   for k, v in value.items())
        return isinstance(value, {"text": str, "bool": bool, "mapping": dict}[self.kind])

    def words(self) -> str:
        """What the value must be, in words."""
        if self.kind in ("integer", "number"):
            what = "an integer" if self.kind == "integer" else "a finite number"
            if self.low is not None and self.high is not None:
                what += f" in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
            elif self.low is not None:
                what += f" {'>' if self.low_open else '>='} {self.low:g}"
        else:
            what = {"text": "a text", "bool": "true or false", "texts": "a list of texts", "mapping": "a mapping",
                    "families": "a mapping of config groups or keys to a list of values (or null)",
                    "seeds": "a seed count, auto or a list of seeds"}[self.kind]
        return f"it must be {what}" + (f" ({self.note})" if self.note else "")


COUNT = Allowed("integer", low=1)
# the smallest Δ of an accuracy that matters: a difference of two fractions
ACCURACY_EFFECT = Allowed("number", low=0, high=1, low_open=True, note="a difference of accuracies")

# Every field of a sweep file (a new field is one line here). The command-line option of the
# same name (`--max-runs` for max_runs) is checked against the same entry.
SWEEP_FILE_FIELDS = {
    "name": Allowed("text"), "description": Allowed("any"), "mode": Allowed("text"), "base": Allowed("text"),
    "tricks": Allowed("texts"), "seeds": Allowed("seeds"), "overrides": Allowed("texts"), "steps": COUNT,
    "families": Allowed("families"), "launcher": Allowed("text"), "max_runs": COUNT, "controls": Allowed("bool"),
    "max_seeds": COUNT, "budget": Allowed("text"), "effect": ACCURACY_EFFECT, "summary": Allowed("text"),
    "variants": Allowed("mapping"),
    "contexts": Allowed("any"),   # a list of {name, overrides} or a mapping: contexts.file_contexts checks the shape
}
# options that are not sweep-file fields
OPTIONS = {"jobs": COUNT, "last_k": COUNT}


def check_options(**given) -> None:
    """Command-line options by their Python names (max_runs=...): each against its table entry;
    None means not given."""
    for name, value in given.items():
        allowed = SWEEP_FILE_FIELDS.get(name) or OPTIONS[name]
        if not allowed.ok(value):
            raise ValueProblem(f"--{name.replace('_', '-')} {value} is not allowed; {allowed.words()}")


def check_sweep_file(path, spec) -> None:
    """The fields of a sweep file: known names, each of its kind and range."""
    if not isinstance(spec, dict):
        raise ValueProblem(f"sweep file {path} must be a mapping of {', '.join(SWEEP_FILE_FIELDS)}")
    unknown = sorted(str(k) for k in set(spec) - set(SWEEP_FILE_FIELDS))
    if unknown:
        raise ValueProblem(f"sweep file {path}: unknown key {', '.join(unknown)}; "
                           f"allowed: {', '.join(SWEEP_FILE_FIELDS)}")
    for key, value in spec.items():
        allowed = SWEEP_FILE_FIELDS[key]
        if not allowed.ok(value):
            raise ValueProblem(f"sweep file {path}: {key}: {value!r} is not allowed; {allowed.words()}")


def load_yaml(text: str):
    """YAML (safe) that refuses a mapping with a key twice: plain YAML keeps the last one, and
    the first (a variant of a sweep file) would silently vanish."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
        twice = sorted({str(k) for k in keys if keys.count(k) > 1})
        if twice:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {', '.join(twice)} is given twice (line {node.start_mark.line + 1})",
                node.start_mark)
        return loader.construct_mapping(node, deep=deep)

    UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(text, Loader=UniqueKeys)
