"""The values a user gives outside the Hydra config: command-line options and sweep-file fields.

Each is an `Allowed` (grpo_ablate/allowed.py: the type every value check goes through), so that
a bad one is one line naming what is allowed; the options' and the sweep file's keys are declared
on the requests (cli/requests.py, sweep/requests.py), and this module holds the common ranges and the sweep file's
check. It imports only the standard library, PyYAML and grpo_ablate.allowed, so `sweep` and
`doctor` refuse a value before the training stack is imported (a wrong `--jobs 0` in well under
a second). The Hydra config's values are checked in config/validate.py; the trick knobs' types and
ranges come from the trick registry.
"""
from __future__ import annotations

from grpo_ablate.allowed import Allowed
from grpo_ablate.errors import UserError


class ValueProblem(UserError, ValueError):
    """A user value that is not allowed: the message is the one line the user sees."""


# null is always allowed here: it means the option or field was not given (its default)
COUNT = Allowed("integer", low=1, optional=True)
# the smallest Δ of an accuracy that matters: a difference of two fractions
ACCURACY_EFFECT = Allowed("number", low=0, high=1, low_open=True, optional=True, note="a difference of accuracies")
TEXT, TEXTS, ANY = Allowed("text", optional=True), Allowed("texts", optional=True), Allowed("any", optional=True)

def check_sweep_file(path, spec, fields: dict) -> None:
    """The fields of a sweep file (`fields`: key -> Allowed, requests.SWEEP_FILE_FIELDS): known
    names, each of its kind and range."""
    if not isinstance(spec, dict):
        raise ValueProblem(f"sweep file {path} must be a mapping of {', '.join(fields)}")
    unknown = sorted(str(k) for k in set(spec) - set(fields))
    if unknown:
        raise ValueProblem(f"sweep file {path}: unknown key {', '.join(unknown)}; "
                           f"allowed: {', '.join(fields)}")
    for key, value in spec.items():
        if (problem := fields[key].problem(value, f"sweep file {path}: {key}: {value!r}")) is not None:
            raise ValueProblem(problem)


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
