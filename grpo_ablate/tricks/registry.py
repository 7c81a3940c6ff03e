"""One registry for every trick family: (family, option) -> the function or class that implements it.

A family is a config group (`conf/<family>/`); an option is one file in it, whose `name`
is the key it is registered under. Every implementation takes the family's data arguments
first (the tensors the trainer hands it: the same for every option of a family) and its
knobs as keyword-only arguments with defaults: the keys of its YAML file. That split is what
lets the config be checked before a run starts: a key in `conf/<family>/<option>.yaml` or on
the command line that is not a knob of the chosen option (a typo: `+adv.epz=0.1`) is an
error that names the knobs the option has, never a silently ignored setting.

Capabilities that the trainer or the config checks must know (an estimator needs a critic,
a statistic needs G >= 2) are flags given at registration and read as attributes.

    @register("adv", "grpo", uses_group_statistic=True)
    def grpo_advantage(rewards, group_index, mask, values, *, eps=1e-6): ...

    option("adv", "grpo").bind({"eps": 1e-4})(rewards, group_index, mask, values)
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

_FAMILIES: dict[str, dict[str, "Option"]] = {}


@dataclass(frozen=True)
class Option:
    family: str
    name: str
    impl: Callable[..., Any]
    flags: dict = field(default_factory=dict)

    def __getattr__(self, flag: str):
        """A capability flag given at registration (False when not given)."""
        if flag.startswith("__"):
            raise AttributeError(flag)
        return self.flags.get(flag, False)

    @property
    def knobs(self) -> dict[str, Any]:
        """The option's keyword-only arguments and their defaults: the keys its config may set."""
        target = self.impl.__init__ if inspect.isclass(self.impl) else self.impl
        return {p.name: p.default for p in inspect.signature(target).parameters.values()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}

    def unknown_keys(self, keys) -> list[str]:
        """The keys among `keys` that are not knobs of this option."""
        knobs = self.knobs
        return [k for k in keys if k not in knobs]

    def bind(self, config: dict | None = None) -> Callable[..., Any]:
        """The implementation with its knobs set from `config` (every key must be a knob)."""
        config = dict(config or {})
        unknown = self.unknown_keys(config)
        if unknown:
            raise TypeError(f"{self.family}={self.name} has no option {', '.join(unknown)}; "
                            f"allowed: {', '.join(self.knobs) or '(none)'}")
        return functools.partial(self.impl, **config) if config else self.impl


def register(family: str, name: str, **flags):
    """Register the decorated function or class as option `name` of `family`."""
    def wrap(impl):
        options = _FAMILIES.setdefault(family, {})
        if name in options:
            raise ValueError(f"{family}={name} is registered twice ({options[name].impl.__qualname__} "
                             f"and {impl.__qualname__})")
        new = Option(family, name, impl, dict(flags))
        first = next(iter(options.values()), None)
        if first is not None and _data_args(first) != _data_args(new):   # one calling convention a family
            raise TypeError(f"{family}={name} takes ({', '.join(_data_args(new))}), but the family's options "
                            f"take ({', '.join(_data_args(first))})")
        options[name] = new
        return impl
    return wrap


class UnknownOption(LookupError):
    """A family or option name that is not registered; the message lists the allowed ones."""


def option(family: str, name: str) -> Option:
    """The registered option, or UnknownOption naming the allowed ones."""
    options = _FAMILIES.get(family)
    if options is None:
        raise UnknownOption(f"no trick family {family!r}; families: {', '.join(sorted(_FAMILIES))}")
    if name not in options:
        raise UnknownOption(f"{family}={name} is not allowed; allowed: {', '.join(sorted(options))}")
    return options[name]


def _data_args(opt: Option) -> list[str]:
    """The positional parameters: the tensors the trainer passes to every option of the family."""
    target = opt.impl.__init__ if inspect.isclass(opt.impl) else opt.impl
    return [p.name for p in inspect.signature(target).parameters.values()
            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.name != "self"]


def options(family: str) -> dict[str, Option]:
    """Every option of a family, by name."""
    return dict(_FAMILIES.get(family, {}))


def families() -> list[str]:
    return sorted(_FAMILIES)
