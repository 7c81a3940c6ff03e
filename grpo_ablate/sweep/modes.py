"""The sweep modes, registered like tricks: one function a mode, with the facts the command and the
planner read from it (what it needs, which options are its own), so that nothing branches on a mode's
name. A mode's function turns named tricks (and its own options) into a Matrix: the variants and the
contrasts that measure each trick. Adding a mode is one function here and, if it takes an option of its
own, that option on SweepArgs (sweep/requests.py). What each mode builds: docs/sweeps.md.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from typing import Callable

from grpo_ablate.design import STREAM_SALT, Contrast, Variant
from grpo_ablate.sweep.matrix import (DEFAULT_PLACEBOS, DIAG_ON, EXPECTABLE, NAME_PATTERN, SWEEP_SETS,
                                      Matrix, SweepError, check_exclusive, check_known, override_value,
                                      trick_overrides, value_label)


@dataclass(frozen=True)
class SweepMode:
    name: str
    build: Callable[..., Matrix]   # (tricks, families, **options): the variants and contrasts
    needs_tricks: bool = True      # refused without --tricks
    exclusive: bool = True         # its runs hold all its tricks at once: two of one family are refused
    default_tricks: bool = False   # with no --tricks and no file: the seed review's default question
    diagnosis: bool = False        # a diagnosis (of training, of the report): no control unless asked
    file_only: bool = False        # only a sweep file gives it (its variants are written out there)
    # the SweepArgs options that belong to this mode alone, each with the line that refuses it elsewhere
    options: dict[str, str] = field(default_factory=dict)
    # the mode's own options as its trick list (conflict: --trick X --reward Y as "X,Y"), refusing bad ones
    tricks_from: Callable | None = None
    # (tricks, **options) -> how many variants it builds, where that is known before building them: a sweep past
    # the run limit is refused before a million placebos are made; `fewer`: what the refusal says to cut
    size: Callable | None = None
    fewer: str = "tricks"


REGISTRY: dict[str, SweepMode] = {}


def sweep_mode(name: str, **facts) -> Callable:
    """Register the decorated function as the sweep mode `name` (facts: SweepMode's fields)."""
    def register(build: Callable[..., Matrix]) -> Callable[..., Matrix]:
        if name in REGISTRY:
            raise ValueError(f"sweep mode {name!r} is registered twice")
        REGISTRY[name] = SweepMode(name, build, **facts)
        return build
    return register


def _variant(name: str, tricks, reference: str | None) -> Variant:
    return Variant(name, tuple(tricks), trick_overrides(tricks), reference)


@sweep_mode("leave-one-out", default_tricks=True)
def leave_one_out(tricks: list[str], families: dict[str, str], **_) -> Matrix:
    """All tricks on, then each dropped in turn: each trick's effect where all the others are on."""
    variants = [_variant("all", tricks, None)]
    variants += [_variant(f"drop-{t}", [u for u in tricks if u != t], "all") for t in tricks]
    return Matrix("leave-one-out", variants, [Contrast(t, "all", f"drop-{t}") for t in tricks])


@sweep_mode("add-one-in", exclusive=False)   # each trick alone: alternatives of one family may both be listed
def add_one_in(tricks: list[str], families: dict[str, str], **_) -> Matrix:
    """Each trick alone on the base."""
    variants = [_variant("base", [], None)] + [_variant(f"add-{t}", [t], "base") for t in tricks]
    return Matrix("add-one-in", variants, [Contrast(t, f"add-{t}", "base") for t in tricks])


@sweep_mode("ladder", exclusive=False)
def ladder(tricks: list[str], families: dict[str, str], **_) -> Matrix:
    """Cumulative rungs; a rung whose trick sets a family an earlier rung set replaces it (DAPO's soft
    overlong punishment replaces overlong filtering in its table)."""
    names = ["base"] + [f"rung{i}-{t}" for i, t in enumerate(tricks, 1)]
    variants, on = [_variant("base", [], None)], []
    for i, t in enumerate(tricks, 1):
        on = [u for u in on if families[u] != families[t]] + [t]
        variants.append(_variant(names[i], on, names[i - 1]))
    return Matrix("ladder", variants, [Contrast(t, names[i], names[i - 1]) for i, t in enumerate(tricks, 1)])


@sweep_mode("factorial", needs_tricks=False, options={
    "family": "--family belongs to `sweep factorial` (it crosses a config group's options or a key's values); other "
              "modes take --tricks a,b,c"})
def factorial(tricks: list[str], families: dict[str, str], axes=None, **_) -> Matrix:
    """Every on/off combination of the tricks (each trick's simple effect at the base), or with
    `axes` (--family) every combination of the axes' values."""
    if axes:
        if tricks:
            raise SweepError("factorial takes either --tricks (on/off combinations) or --family "
                             "(option combinations), not both")
        return _family_factorial(axes)
    if not tricks:
        raise SweepError("sweep factorial needs tricks: --tricks a,b,c (see `grpo-ablate tricks`)")
    variants = []
    for on in itertools.product((False, True), repeat=len(tricks)):
        chosen = [t for t, o in zip(tricks, on) if o]
        variants.append(_variant("+".join(chosen) or "base", chosen, None if not chosen else "base"))
    return Matrix("factorial", variants, [Contrast(t, t, "base") for t in tricks])


@sweep_mode("pairwise")
def pairwise(tricks: list[str], families: dict[str, str], **_) -> Matrix:
    """The base, each trick alone and each pair: the pairs' gradient diagnostics (report/diagnostics.py)."""
    if len(tricks) < 2:
        raise SweepError("sweep pairwise needs at least two tricks: --tricks a,b[,c...]")
    variants = [_variant("base", [], None)] + [_variant(t, [t], "base") for t in tricks]
    variants += [_variant(f"{a}+{b}", [a, b], "base") for a, b in itertools.combinations(tricks, 2)]
    return Matrix("pairwise", variants, [Contrast(t, t, "base") for t in tricks])   # each trick's effect at the base


def conflict_tricks(given) -> str:
    """`sweep conflict --trick X --reward Y` as the matrix's trick list "X,Y"."""
    if given.tricks:
        raise SweepError("sweep conflict takes --trick X --reward Y, not --tricks")
    if not given.trick or not given.reward:
        raise SweepError("sweep conflict needs --trick X and --reward Y "
                         "(e.g. --trick entropy_bonus --reward length_penalty)")
    if given.trick == given.reward:
        raise SweepError(f"--trick and --reward both name {given.trick}; give a trick and a different reward term")
    return f"{given.trick},{given.reward}"


CONFLICT_ONLY = "--trick and --reward belong to `sweep conflict`; other modes take --tricks a,b,c"


@sweep_mode("conflict", exclusive=False, diagnosis=True, tricks_from=conflict_tricks,
            options={"trick": CONFLICT_ONLY, "reward": CONFLICT_ONLY})
def conflict(tricks: list[str], families: dict[str, str], reward_terms: frozenset[str] = frozenset(), **_) -> Matrix:
    """The seed review's check before combining a new trick with a new reward term: run the base, base +
    trick and base + reward term separately (never both on), with the gradient diagnostics, and combine
    them only if they pull the same way."""
    if len(tricks) != 2:
        raise SweepError("sweep conflict takes one trick and one reward term: --trick X --reward Y")
    trick, reward = tricks
    # what `--reward` takes: a named trick whose option adds a term to the reward (its gradient
    # shows up as that term, e.g. length_reward, in the diagnostics)
    if reward not in reward_terms:
        raise SweepError(f"--reward {reward} adds no term to the reward; allowed: {', '.join(sorted(reward_terms))} "
                         "(named tricks whose option shapes the reward)")
    variants = [Variant("base", (), DIAG_ON, None),
                Variant(f"trick-{trick}", (trick,), trick_overrides([trick]) + DIAG_ON, "base"),
                Variant(f"reward-{reward}", (reward,), trick_overrides([reward]) + DIAG_ON, "base")]
    contrasts = [Contrast(trick, f"trick-{trick}", "base"), Contrast(reward, f"reward-{reward}", "base")]
    return Matrix("conflict", variants, contrasts)


@sweep_mode("aa", needs_tricks=False, diagnosis=True, fewer="placebos (--placebos)",
            size=lambda tricks, placebos=DEFAULT_PLACEBOS, **_: placebos + 1, options={
    "placebos": "--placebos belongs to `sweep aa` (the A/A sweep); other modes measure tricks",
    "determinism": "--determinism belongs to `sweep aa` with a fixed --seeds (it re-runs the reference's first "
                   "seed twice)"})
def placebo_matrix(tricks: list[str], families: dict[str, str] | None = None, placebos: int = DEFAULT_PLACEBOS,
                   **_) -> Matrix:
    """The reference and `placebos` copies of it, each with its own sampling stream (salts 1..K; the
    reference keeps salt 0, the seed's own stream). Each placebo is a contrast named after itself,
    with the reference on the `with` side as a leave-one-out's "all", so the report tests them as
    one star family (blocked, Holm) exactly as it tests tricks."""
    if placebos < 1:
        raise SweepError(f"--placebos {placebos} is not allowed; give a count >= 1")
    reference = _variant("all", tricks, None)
    variants = [reference] + [Variant(f"placebo-{i}", tuple(tricks), (*reference.overrides, f"{STREAM_SALT}={i}"),
                                      "all") for i in range(1, placebos + 1)]
    contrasts = [Contrast(v.name, "all", v.name) for v in variants[1:]]
    return Matrix("aa", variants, contrasts)


@sweep_mode("variants", needs_tricks=False, file_only=True)
def variants_matrix(variants: dict, *_, **__) -> Matrix:
    """`mode: variants` of a sweep file: `variants` maps each name to its overrides, either a
    list or {overrides: [...], against: NAME, expect: VERDICT or [VERDICTS]}. Every variant but
    the first is measured against `against` (default: the first variant, the reference), and
    `expect` records the verdict a correct report must give that contrast (known-answer checks)."""
    if not isinstance(variants, dict) or not variants:
        raise SweepError("a variants sweep needs `variants`: a mapping of variant name -> its overrides")
    names = list(variants)
    parsed = [_parse_variant(str(name), spec, names) for name, spec in variants.items()]
    first = names[0]
    built, contrasts = [], []
    for i, (name, overrides, against, expect, contexts) in enumerate(parsed):
        if i == 0 and (against is not None or expect):
            raise SweepError(f"variant {name} is the reference (the first listed): it takes no against or expect")
        reference = None if i == 0 else (against or first)
        if reference == name:
            raise SweepError(f"variant {name} is measured against itself; name another variant in its against")
        built.append(Variant(name, (), overrides, reference, expect=expect, contexts=contexts))
        if reference is not None:
            contrasts.append(Contrast(name, name, reference))
    return Matrix("variants", built, contrasts)


def _family_factorial(axes: list[tuple[str, list]]) -> Matrix:
    """Every combination of the axes' values; the first combination is the reference."""
    keys = [key for key, _ in axes]
    if len(set(keys)) != len(keys):
        raise SweepError(f"--family {', '.join(k for k in keys if keys.count(k) > 1)} is given twice")
    for key, values in axes:
        if not values:
            raise SweepError(f"--family {key} has no values to sweep")
    variants = []
    for combo in itertools.product(*(values for _, values in axes)):
        parts = [value_label(key, value) for key, value in zip(keys, combo)]
        name = ".".join(parts)
        overrides = tuple(f"{key}={override_value(value)}" for key, value in zip(keys, combo))
        variants.append(Variant(name, (), overrides, None if not variants else variants[0].name,
                                axes=dict(zip(keys, combo))))
    return Matrix("factorial", variants, [])


def _parse_variant(name: str, spec, names: list) -> tuple:
    """(name, overrides, against, expect, contexts) of one entry of a variants file, checked."""
    if not re.fullmatch(NAME_PATTERN, name):
        raise SweepError(f"variant name {name!r} is not allowed; use letters, digits and _ . + -")
    if name.startswith("control-"):   # the controls' names (sweep/controls.py): two plans would write one run dir
        raise SweepError(f"variant name {name} is not allowed; names starting with control- are the no-RL "
                         "controls' (--controls adds them)")
    spec = {"overrides": spec} if isinstance(spec, list) or spec is None else spec
    if not isinstance(spec, dict) or set(spec) - {"overrides", "against", "expect", "contexts"}:
        raise SweepError(f"variant {name}: give a list of overrides or a mapping of overrides, against, expect, "
                         "contexts")
    contexts = spec.get("contexts") or []
    if not isinstance(contexts, list) or not all(isinstance(c, str) for c in contexts):
        raise SweepError(f"variant {name}: contexts must be a list of context names (the file's `contexts`)")
    overrides = spec.get("overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        raise SweepError(f"variant {name}: overrides must be a list of key=value overrides")
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    for o, key in zip(overrides, keys):
        if key.split(".")[0] in SWEEP_SETS:
            raise SweepError(f"variant {name}: '{o}' sets {key}, which the sweep sets for every run")
    if keys.count("trick") > 1:   # Hydra takes one value per group: several +trick= would fail in every run
        raise SweepError(f"variant {name}: {keys.count('trick')} +trick= overrides; list its named tricks in one, "
                         f"\"+trick=[a,b]\" (quoted in YAML)")
    against = spec.get("against")
    if against is not None and against not in names:
        raise SweepError(f"variant {name} is measured against {against}, which is not a variant of this file; "
                         f"variants: {', '.join(map(str, names))}")
    expect = spec.get("expect") or []
    expect = [expect] if isinstance(expect, str) else expect
    bad = [e for e in expect if e not in EXPECTABLE] if isinstance(expect, list) else [expect]
    if bad:
        raise SweepError(f"variant {name}: expect {', '.join(map(str, bad or [expect]))} is not a verdict; "
                         f"allowed: {', '.join(EXPECTABLE)}")
    return name, tuple(overrides), against, tuple(expect), tuple(contexts)


# the modes the command line names (a file-only mode is a sweep file's), and those only a file gives
MODES = tuple(name for name, mode in REGISTRY.items() if not mode.file_only)
FILE_MODES = tuple(name for name, mode in REGISTRY.items() if mode.file_only)


def mode_named(name: str) -> SweepMode:
    """The registered mode, or the one line that names the modes there are."""
    if name not in MODES:
        raise SweepError(f"sweep mode {name!r} is not allowed; allowed: {', '.join(MODES)}, file")
    return REGISTRY[name]


def build_matrix(mode: str, tricks: list[str], families: dict[str, str],
                 axes: list[tuple[str, list]] | None = None, reward_terms: frozenset[str] = frozenset(),
                 **mode_options) -> Matrix:
    """Variants and contrasts of a sweep. `families` maps every named trick to its family;
    `axes` (factorial only) lists (config key or group, values) to cross instead of tricks;
    `reward_terms` (conflict only): the named tricks whose option adds a term to the reward (the
    registry's shapes_reward flag). A conflict sweep's `tricks` are [the trick, the reward term].
    `mode_options`: the mode's own options as given (aa: placebos, the placebo variants beside the reference)."""
    tricks, chosen = list(tricks), mode_named(mode)
    check_known(tricks, families)
    if chosen.exclusive:
        check_exclusive(tricks, families)
    if chosen.needs_tricks and not tricks:
        raise SweepError(f"sweep {mode} needs tricks: --tricks a,b,c (see `grpo-ablate tricks`)")
    return chosen.build(tricks, families, axes=axes, reward_terms=reward_terms, **mode_options)
