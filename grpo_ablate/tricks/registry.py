"""One registry for every trick family: (family, option) -> the implementation and the facts about it.

A family is a config group (`conf/<family>/`); an option is one file in it, whose `name`
is the key it is registered under, written from the registration by `make catalogue`
(Option.config). Every implementation takes the family's data arguments first (the tensors
the trainer hands it: the same for every option of a family) and its knobs as keyword-only
arguments with defaults: the keys of its YAML file. That split is what
lets the config be checked before a run starts: a key in `conf/<family>/<option>.yaml` or on
the command line that is not a knob of the chosen option (a typo: `+adv.epz=0.1`) is an
error that names the knobs the option has, never a silently ignored setting.

Everything else that is known about an option is given where it is registered, and every
other place reads it from here: the range and type of each knob (`Allowed`: config/validate.py checks
them; an option whose knob has none is refused at registration), its activity metric (what
shows in a run that it acted: the report's *inert here*), the conditions under which it
cannot act (`Inert`: train warns, sweep and doctor refuse), checks that involve other settings,
and the named tricks that select it (`Trick`: the catalogue text, source, cost, and the
claims of the literature, shown by `grpo-ablate tricks`, docs/tricks.md and docs/config.md).
Capabilities that the trainer or the config checks must know (an estimator needs a critic,
a statistic needs G >= 2) are flags given at registration and read as attributes.

    @register("adv", "grpo", uses_group_statistic=True, knobs={"eps": POSITIVE})
    def grpo_advantage(rewards, group_index, mask, values, *, eps=1e-6): ...

    option("adv", "grpo").bind({"eps": 1e-4})(rewards, group_index, mask, values)

A family is declared once (`declare_family`: its one-line summary, the settings of its
config group that the trainer reads itself, the knobs the trainer supplies); a family whose
options have no function of their own (dual_clip, updates) registers them with `declare`.
This module imports only the standard library and grpo_ablate.allowed.
"""
from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from grpo_ablate.allowed import FLAG, FRACTION, NON_NEGATIVE, NUMBER, POSITIVE, POSITIVE_INT, Allowed, ReadWhen, choice

__all__ = ["FLAG", "FRACTION", "NON_NEGATIVE", "NUMBER", "POSITIVE", "POSITIVE_INT", "Allowed", "ReadWhen", "choice"]

_FAMILIES: dict[str, dict[str, "Option"]] = {}
_DECLARED: dict[str, "Family"] = {}
_FLAGS: set[str] = set()   # every capability flag some option was registered with


# ------------------------------------------------------------------------------ the facts
# A knob's range is an `Allowed` (grpo_ablate/allowed.py: the one type every user value is
# checked with); `options_of(family)` lists a registry family's options as the allowed choices.


def options_of(family: str) -> Allowed:
    return Allowed("choice", choices=lambda: tuple(sorted(_FAMILIES.get(family, {}))))


@dataclass(frozen=True)
class Activity:
    """The metric that shows an option acted in a run (a necessary condition): `nonzero` at some
    step, `changes` (more than one value over the steps) or `above` a threshold at some step."""
    metric: str
    kind: str = "nonzero"
    threshold: float | None = None

    def __post_init__(self):
        if self.kind not in ("nonzero", "changes", "above") or (self.kind == "above") != (self.threshold is not None):
            raise ValueError(f"Activity({self.metric!r}): kind nonzero | changes | above (with a threshold only)")


@dataclass(frozen=True)
class Inert:
    """A condition of a composed config under which the option changes nothing: why, the fix,
    and the requirement as `grpo-ablate tricks` shows it. `when(cfg)` reads the config by
    attribute and key only (no import: this package imports only torch)."""
    when: Callable[[Any], bool]
    why: str
    fix: str
    requires: str


@dataclass(frozen=True)
class Claim:
    """What a seed document claims about a trick, as data the report checks (report/transfer.py):
    its `effect` against the option the trick replaces, `where` the context it was made in (axis=value
    pairs, comma separated: model=base|aligned, data=easy|medium|hard, reward=0/1|-1/1; "" = in
    general), its `source`, the claim in a sentence (`says`) and what it is about (`measure`): the
    level the report's verdict compares (`level`), the asymptote of the compute-performance fit
    (`ceiling`, judged by the fits' ceiling verdict: report/scaling.py), or a sampled eval's metric
    (`pass@k`: judged by the trick's verdict on pass@n of an eval of n samples per problem,
    report/boundary.py; `avg@k`: by its verdict on the mean correctness of those samples)."""
    effect: str
    where: str
    source: str
    says: str
    measure: str = "level"

    EFFECTS = ("helps", "hurts", "does not help", "does not hurt", "no effect")
    MEASURES = ("level", "ceiling", "pass@k", "avg@k")
    AXES = {"model": ("base", "aligned"), "data": ("easy", "medium", "hard"), "reward": ("0/1", "-1/1")}

    def __post_init__(self):
        if self.effect not in self.EFFECTS:
            raise ValueError(f"claim {self.says!r}: effect {self.effect!r}; allowed: {', '.join(self.EFFECTS)}")
        if self.measure not in self.MEASURES:
            raise ValueError(f"claim {self.says!r}: measure {self.measure!r}; allowed: {', '.join(self.MEASURES)}")
        for axis, value in self.where_tags.items():
            if value not in self.AXES.get(axis, ()):
                raise ValueError(f"claim {self.says!r}: where {axis}={value}; allowed: "
                                 + "; ".join(f"{a}={'|'.join(v)}" for a, v in self.AXES.items()))

    @property
    def where_tags(self) -> dict:
        return dict(part.strip().split("=", 1) for part in self.where.split(",") if part.strip())


TRICKS_OR_TRAPS = "Tricks or Traps (Liu et al. 2025; seeds/003)"
SCALERL = "ScaleRL (Khatri et al. 2025, arXiv 2510.13786)"
RGRA = "RGRA (Carrino et al. 2026, arXiv 2603.18756)"
DAPO = "DAPO (Yu et al. 2025; seeds/003)"
SEED_REVIEW = "the seed review's table (seeds/000)"


@dataclass(frozen=True)
class Trick:
    """A named trick (`+trick=<name>`, `conf/trick/<name>.yaml`) that selects the option it is
    registered with: the catalogue's text for it. `verdict`: the seed review's; `claims`: what
    the seed documents claim about it (`Claim`s: the report sets its measurements beside them)."""
    name: str
    what: str
    source: str
    verdict: str
    cost: str = "none"
    claims: tuple = ()
    settings: dict = field(default_factory=dict, hash=False)   # what its conf/trick file sets beyond the option's own

    VERDICTS = ("baseline", "strongly_recommended", "recommended", "use_with_care", "not_recommended",
                "completely_unnecessary", "not_applicable", "not_in_review")

    def __post_init__(self):
        if self.verdict not in self.VERDICTS:
            raise ValueError(f"trick {self.name}: verdict {self.verdict!r}; allowed: {', '.join(self.VERDICTS)}")


@dataclass(frozen=True)
class Family:
    """A trick family: its summary (docs/config.md's option table), the settings of its config group
    that the trainer reads itself (name -> (Allowed, the capability flag an option needs to have
    the setting, or None)), and the knobs of its options that the trainer supplies (name -> by what)."""
    name: str
    summary: str
    metric: str = "loss"                  # a metric every option of the family writes at every step
    settings: dict = field(default_factory=dict)
    supplied: dict = field(default_factory=dict)
    module: str = ""                      # where it is declared (docs/config.md points there)
    stage: str = "loss"                   # where in a step it acts (STAGES)
    default: str = "none"                 # the option conf/config.yaml selects
    defaults: dict = field(default_factory=dict)   # setting -> its value in every option that has the setting
    # the option under which the family does what every run did before it existed (a family added after
    # runs existed): a run at it hashes as those runs did, so they still resume (config/identity.py)
    neutral: str | None = None


# Where in a step a family acts, in the order a step meets them: the order of the families in
# conf/config.yaml's defaults list and in docs/config.md's table (both written by `make catalogue`).
STAGES = ("reward", "batch", "advantage", "loss", "async", "model", "optimizer")


def declare_family(name: str, summary: str, *, stage: str, default: str = "none", metric: str = "loss",
                   settings: dict | None = None, supplied: dict | None = None, defaults: dict | None = None,
                   neutral: str | None = None) -> None:
    """Declare a family once, in its module. stage: one of STAGES; default: the option a run
    takes unless told otherwise; settings: {key: Allowed or (Allowed, flag)}; defaults: {setting: value},
    written into the config of every option that has the setting (an option's own defaults win);
    neutral: a family added after runs existed names the option that changes nothing (its `none`), at
    which a run's identity leaves the family out, so runs recorded before it hash and resume as they did."""
    if name in _DECLARED:
        raise ValueError(f"trick family {name!r} is declared twice")
    if stage not in STAGES:
        raise ValueError(f"trick family {name!r}: stage {stage!r}; allowed: {', '.join(STAGES)}")
    norm = {k: v if isinstance(v, tuple) else (v, None) for k, v in (settings or {}).items()}
    module = sys._getframe(1).f_globals.get("__name__", "")   # the declaring module, for docs/config.md
    unknown = [k for k in defaults or {} if k not in norm]
    if unknown:
        raise ValueError(f"trick family {name!r}: defaults for {', '.join(unknown)}, which is not a setting")
    _DECLARED[name] = Family(name, summary, metric, norm, dict(supplied or {}), module, stage, default,
                             dict(defaults or {}), neutral)


def declared_families() -> list[Family]:
    """Every declared family, stage by stage (STAGES), in declaration order within a stage."""
    return sorted(_DECLARED.values(), key=lambda f: STAGES.index(f.stage))


def family_info(name: str) -> Family:
    """The declared family (a family without a declaration has no settings of its own)."""
    return _DECLARED.get(name) or Family(name, "")




@dataclass(frozen=True)
class Option:
    family: str
    name: str
    impl: Callable[..., Any] | None      # None: a config-only option (declare), the trainer reads its settings
    flags: dict = field(default_factory=dict)
    ranges: dict = field(default_factory=dict)      # knob -> Allowed
    activity: Activity | None = None
    inert: tuple = ()                               # Inert rules
    checks: tuple = ()                              # cfg -> a message (the config is refused) or None
    tricks: tuple = ()                              # the named tricks (Trick) that select this option
    writes: tuple = ()                              # metrics it writes every step (default: its family's)
    what: str = ""                                  # one line: what it is (its config file's header)
    defaults: dict = field(default_factory=dict)    # config defaults unlike the signature's, and its settings
    notes: dict = field(default_factory=dict)       # knob or setting -> a note beside it in its config file

    @property
    def metrics(self) -> tuple:
        """The metrics a run with this option writes at every step."""
        return self.writes or (family_info(self.family).metric,)

    def __getattr__(self, flag: str):
        """A capability flag given at registration (False when this option was not given it; a name no
        option was ever given is a typo, and an error, not a silent False)."""
        if flag.startswith("__") or flag not in _FLAGS:
            raise AttributeError(f"{flag!r} is not a capability flag of any trick option; flags: "
                                 f"{', '.join(sorted(_FLAGS))}")
        return self.flags.get(flag, False)

    @property
    def knobs(self) -> dict[str, Any]:
        """The option's keyword-only arguments and their defaults: the keys its config may set."""
        return _knobs(self.impl)

    def settings(self) -> list[str]:
        """The settings of its family that this option has (one tied to a capability flag only with the flag)."""
        return [k for k, (_, flag) in family_info(self.family).settings.items()
                if flag is None or self.flags.get(flag, False)]

    def config(self) -> dict:
        """Its config node (conf/<family>/<name>.yaml, written by `make catalogue`): name, the knobs the
        trainer does not supply with their signature defaults unless `defaults` says otherwise, then the
        family's settings that have a default (the family's, or this option's)."""
        info = family_info(self.family)
        node = {"name": self.name}
        node.update({k: self.defaults.get(k, v) for k, v in self.knobs.items() if k not in info.supplied})
        node.update({k: self.defaults.get(k, info.defaults.get(k)) for k in self.settings()
                     if k in self.defaults or k in info.defaults})
        return {k: list(v) if isinstance(v, tuple) else v for k, v in node.items()}

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


def register(family: str, name: str, *, knobs: dict | None = None, activity: Activity | None = None,
             inert=(), checks=(), tricks=(), writes=(), what: str = "", defaults: dict | None = None,
             notes: dict | None = None, **flags):
    """Register the decorated function or class as option `name` of `family`, with its facts:
    knobs {knob: Allowed} (every keyword-only argument that the trainer does not supply), activity,
    inert (an Inert or several), checks (cfg -> message or None), tricks (the named Tricks),
    writes (the metrics it writes every step, when not its family's), what (one line; default: the
    function's docstring's first line), defaults {knob or setting: value} (only where the config's
    default is not the signature's, and the family's settings it has), notes {knob or setting: text}
    (shown beside the key in its config file)."""
    def wrap(impl):
        _add(Option(family, name, impl, dict(flags), dict(knobs or {}), activity, _tuple(inert), _tuple(checks),
                    _tuple(tricks), tuple(writes), what or _first_line(impl), dict(defaults or {}),
                    dict(notes or {})))
        return impl
    return wrap


def _first_line(impl) -> str:
    return (inspect.getdoc(impl) or "").split("\n\n", 1)[0].replace("\n", " ").strip()


def declare(family: str, name: str, *, activity: Activity | None = None, inert=(), checks=(), tricks=(),
            writes=(), **flags) -> None:
    """Register a config-only option (no function: the trainer reads its family's settings)."""
    _add(Option(family, name, None, dict(flags), {}, activity, _tuple(inert), _tuple(checks), _tuple(tricks),
                tuple(writes)))


def _tuple(value) -> tuple:
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _add(new: Option) -> None:
    family, name = new.family, new.name
    _FLAGS.update(new.flags)
    options = _FAMILIES.setdefault(family, {})
    if name in options:
        raise ValueError(f"{family}={name} is registered twice")
    first = next(iter(options.values()), None)
    if first is not None and (first.impl is None) != (new.impl is None):
        raise TypeError(f"{family}={name}: a family's options all have functions, or none has (declare)")
    if first is not None and new.impl is not None and _data_args(first) != _data_args(new):
        raise TypeError(f"{family}={name} takes ({', '.join(_data_args(new))}), but the family's options "
                        f"take ({', '.join(_data_args(first))})")   # one calling convention a family
    supplied = family_info(family).supplied
    missing = [k for k in new.knobs if k not in new.ranges and k not in supplied]
    if missing:
        raise TypeError(f"{family}={name}: knob {', '.join(missing)} has no declared range: "
                        f"register(..., knobs={{{missing[0]!r}: Allowed(...)}})")
    keys = [k for k in new.knobs if k not in supplied] + new.settings()
    stray = [k for k in (*new.defaults, *new.notes) if k not in keys]
    if stray:
        raise TypeError(f"{family}={name}: defaults or notes for {', '.join(stray)}, which is not a knob or setting "
                        f"of it; allowed: {', '.join(keys) or '(none)'}")
    extra = [k for k in new.ranges if k not in new.knobs]
    if extra:
        raise TypeError(f"{family}={name}: knobs={{{', '.join(map(repr, extra))}: ...}} is not a keyword-only "
                        f"argument of {new.impl.__qualname__ if new.impl else 'a config-only option'}")
    taken = {t.name: (o.family, o.name) for f in _FAMILIES.values() for o in f.values() for t in o.tricks}
    for trick in new.tricks:
        if trick.name in taken:
            raise ValueError(f"trick {trick.name} is registered twice "
                             f"({'='.join(taken[trick.name])} and {family}={name})")
    options[name] = new


def unregister(family: str, name: str) -> None:
    """Remove an option (tests register throwaway options; the trainer never calls this)."""
    _FAMILIES.get(family, {}).pop(name, None)
    if family in _FAMILIES and not _FAMILIES[family]:
        del _FAMILIES[family]


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


def _knobs(impl) -> dict[str, Any]:
    return dict(_signature_knobs(impl)) if impl is not None else {}


@functools.lru_cache(maxsize=None)
def _signature_knobs(impl) -> dict[str, Any]:
    """Read once per function: validating a config asks every family's option for its knobs."""
    target = impl.__init__ if inspect.isclass(impl) else impl
    return {p.name: p.default for p in inspect.signature(target).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def options(family: str) -> dict[str, Option]:
    """Every option of a family, by name."""
    return dict(_FAMILIES.get(family, {}))


def families() -> list[str]:
    return sorted(_FAMILIES)


def all_options() -> list[Option]:
    """Every registered option, family by family (sorted), in registration order within a family."""
    return [o for family in sorted(_FAMILIES) for o in _FAMILIES[family].values()]
