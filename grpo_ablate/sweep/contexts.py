"""The contexts a sweep's matrix is repeated in: `--across KEY=a,b` and a sweep file's `contexts:`.

A context is a name and the overrides that make it (an aligned-like model, hard data, rewards
{-1,1}). `with_contexts` copies each variant into each context as `<variant>@<context>` and
each contrast as `<trick>@<context>`, so every later stage (seeds, looks, verdicts) works per
context unchanged; the report's transfer section (report/transfer.py) reads across them.
`check_contexts` refuses a context that would change what a variant changes.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import replace

import yaml

from grpo_ablate.design import Context, Contrast
from grpo_ablate.sweep.matrix import NAME_PATTERN, SWEEP_SETS, Matrix, SweepError, split_top_level, value_label


# what a context may not set: what the sweep sets for every run, and its own options (which tricks,
# the base, the controls, the steps)
_CONTEXT_RESERVED = (*SWEEP_SETS, "trick", "preset", "control", "steps")


def across_contexts(specs: list[str]) -> list[Context]:
    """`--across KEY=a,b` (repeatable) as contexts: every combination of the keys' values, named by
    their labels (`level-hard`, `wrong--1`, a group's option as itself) or by the user's names
    (`--across reward.wrong=strict=-1,lenient=0`). A value may be a list: `optim.betas=[0.9,0.99],[0.9,0.999]`."""
    axes = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        key, items = key.strip(), split_top_level(values) if sep else []
        if not key or not items or "" in items:
            raise SweepError(f"--across {spec!r} is not allowed; give KEY=v1,v2 (e.g. --across task.level=easy,hard) "
                             "or KEY=name1=v1,name2=v2 to name the contexts")
        named = [item.partition("=") if "=" in item and not item.startswith(("[", "{")) else ("", "", item)
                 for item in items]
        values_ = [value.strip() for _, _, value in named]
        labels = [name.strip() or value_label(key, value) for (name, _, _), value in zip(named, values_)]
        _check_distinct(spec, values_, labels)
        axes.append((key, list(zip(labels, values_))))
    keys = [k for k, _ in axes]
    if len(set(keys)) != len(keys):
        raise SweepError(f"--across {', '.join(sorted({k for k in keys if keys.count(k) > 1}))} is given twice; "
                         "list its values once: --across KEY=a,b,c")
    return [Context(".".join(label for label, _ in combo), tuple(f"{k}={v}" for k, (_, v) in zip(keys, combo)))
            for combo in itertools.product(*(items for _, items in axes))]


def _check_distinct(spec: str, values: list[str], labels: list[str]) -> None:
    """One context per value: a value given twice (also `2e-4` and `0.0002`: the same number) or two
    values whose labels collide (`/a/x` and `/a_x`) is refused, with how to name them."""
    parsed = [_typed_value(v) for v in values]
    for i, value in enumerate(parsed):
        for j in range(i):
            if parsed[j] == value and type(parsed[j]) is type(value):
                same = (f"{values[i]} is listed twice" if values[j] == values[i]
                        else f"{values[j]} and {values[i]} are the same value")
                raise SweepError(f"--across {spec}: {same}; give each value once")
    for i, label in enumerate(labels):
        if not re.fullmatch(NAME_PATTERN, label):
            raise SweepError(f"--across {spec}: context name {label!r} is not allowed; use letters, digits and "
                             "_ . + -")
        if label in labels[:i]:
            raise SweepError(f"--across {spec}: {values[labels.index(label)]} and {values[i]} would both be named "
                             f"{label}; name them: KEY=name1=v1,name2=v2")


def _typed_value(text: str):
    """A context value as Hydra will read it (`2e-4` == `0.0002`, `[0.9, 0.99]` == `[0.9,0.99]`)."""
    try:
        return float(text)     # YAML 1.1 reads `2e-4` as text; Hydra reads it as a number
    except ValueError:
        pass
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return tuple(value) if isinstance(value, list) else value if isinstance(value, (int, float, bool, str)) \
        else text


def file_contexts(spec) -> list[Context]:
    """A sweep file's `contexts`: a list of {name, overrides} (or a mapping name -> overrides)."""
    items = list(spec.items()) if isinstance(spec, dict) else None
    if items is None:
        if not isinstance(spec, list) or not all(isinstance(c, dict) and set(c) <= {"name", "overrides"}
                                                 and "name" in c for c in spec):
            raise SweepError("contexts must be a list of {name: NAME, overrides: [key=value, ...]} "
                             "(or a mapping of name -> overrides)")
        items = [(c["name"], c.get("overrides")) for c in spec]
    contexts = []
    for name, overrides in items:
        overrides = overrides or []
        if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
            raise SweepError(f"context {name}: overrides must be a list of key=value overrides")
        contexts.append(Context(str(name), tuple(overrides)))
    return contexts


def check_contexts(contexts: list[Context], matrix: Matrix, families: dict[str, str], common=()) -> None:
    """Names that can be run dirs, once each; at least two (one context is just overrides);
    no key the sweep sets itself, nor one that `common` (every run's overrides) sets already;
    nothing that changes what a variant changes: a context that set the family of a trick under
    test would change the trick, not the setting it is tried in."""
    names = [c.name for c in contexts]
    for c in contexts:
        if not re.fullmatch(NAME_PATTERN, c.name):
            raise SweepError(f"context name {c.name!r} is not allowed; use letters, digits and _ . + -")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SweepError(f"context {', '.join(twice)} is listed twice; give each context its own name")
    if len(contexts) < 2:
        raise SweepError("a sweep across contexts needs at least two (one context is just overrides: give them "
                         "as overrides of every run)")
    touched = {}      # a config group or top-level key -> the variant that changes it
    for v in matrix.variants:
        for o in v.overrides:
            key = o.split("=", 1)[0].lstrip("+~")
            tops = ([families.get(t, t) for t in _listed(o.split("=", 1)[1])] if key == "trick"
                    else [key.split(".")[0]])
            touched.update({top: v.name for top in tops if top not in touched})
        touched.update({key.split(".")[0]: v.name for key in v.axes if key.split(".")[0] not in touched})
    given = {o.split("=", 1)[0].lstrip("+~"): o for o in common}
    for c in contexts:
        keys = [o.split("=", 1)[0].lstrip("+~") for o in c.overrides]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:   # Hydra keeps the last: the first would be recorded in the context and never act
            raise SweepError(f"context {c.name}: {', '.join(twice)} is given twice; give each key once")
        for o in c.overrides:
            key = o.split("=", 1)[0].lstrip("+~")
            top = key.split(".")[0]
            if key in given:
                raise SweepError(f"context {c.name}: '{o}' sets {key}, which '{given[key]}' sets for every run; "
                                 "give it in one place")
            if top in _CONTEXT_RESERVED:
                raise SweepError(f"context {c.name}: '{o}' sets {key}, which the sweep sets for every run; "
                                 "contexts set the model, the task, the reward, ...")
            if top in touched:
                raise SweepError(f"context {c.name}: '{o}' changes {top}, which variant {touched[top]} changes "
                                 f"(a trick under test); a context may only set what no variant changes")


def with_contexts(matrix: Matrix, contexts: list[Context]) -> Matrix:
    """Every variant in every context it runs in (a variants file may name a subset; its
    reference runs wherever it is needed), every contrast in every context that has both sides."""
    names = [c.name for c in contexts]
    runs_in = {v.name: set(v.contexts or names) for v in matrix.variants}
    for v in matrix.variants:
        unknown = [c for c in v.contexts if c not in names]
        if unknown:
            raise SweepError(f"variant {v.name}: context {', '.join(unknown)} is not one of this sweep's; "
                             f"contexts: {', '.join(names)}")
    for v in matrix.variants:       # a reference runs where its variants are measured against it
        if v.reference and not runs_in[v.name] <= runs_in[v.reference]:
            missing = sorted(runs_in[v.name] - runs_in[v.reference], key=names.index)
            raise SweepError(f"variant {v.name} runs in {', '.join(missing)}, where its reference {v.reference} "
                             f"does not; add those contexts to {v.reference}'s")
    at = lambda name, ctx: f"{name}@{ctx}"
    variants = [replace(v, name=at(v.name, c.name), overrides=c.overrides + v.overrides,
                        reference=at(v.reference, c.name) if v.reference else None, context=c.name, contexts=())
                for c in contexts for v in matrix.variants if c.name in runs_in[v.name]]
    contrasts = [Contrast(at(k.trick, c.name), at(k.with_, c.name), at(k.without, c.name), context=c.name,
                          tests=k.trick)
                 for k in matrix.contrasts for c in contexts
                 if c.name in runs_in[k.with_] and c.name in runs_in[k.without]]
    return Matrix(matrix.mode, variants, contrasts)


def _listed(value: str) -> list[str]:
    """`[a,b]` or `a` as a list of names."""
    return [t.strip() for t in value.strip().strip("[]").split(",") if t.strip()]
