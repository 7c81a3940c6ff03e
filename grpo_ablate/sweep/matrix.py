"""The ablation matrix, pure Python and unit-tested: variants, contrasts, jobs, seeds.

`build_matrix` turns a mode (MODES, FILE_MODES) and named tricks into variants and the contrasts
that measure each trick; `expand_jobs` crosses the variants with seeds into every run's exact
`grpo-ablate train` overrides. Planning is plan.py's; contexts are contexts.py's.
Design: docs/sweeps.md#the-matrix-variants-contrasts-jobs (what each mode builds).
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from grpo_ablate.design import Contrast, Variant
from grpo_ablate.errors import UserError


MODES = ("leave-one-out", "add-one-in", "ladder", "factorial", "pairwise", "conflict", "aa")
FILE_MODES = ("variants",)   # modes only a sweep file can give (their variants are written out there)
# What a `variants` sweep file may expect of a contrast: the report's verdicts (report/verdicts.py;
# tests/test_sweep.py checks that the two lists agree)
EXPECTABLE = ("helps", "hurts", "breaks training", "no evidence", "inert here", "no verdict")
NAME_PATTERN = r"[A-Za-z0-9_.+-]+"        # variant and context names: they become run dir names
# top-level keys the sweep sets for every run (hydra: each job's dir and launcher): no variant
# or context may set them
SWEEP_SETS = ("seed", "resume", "run", "sweep", "hydra")
DIAG_ON = ("diag.grad_conflict=true",)   # a conflict sweep's runs log the gradient diagnostics
# An A/A sweep's placebos unless told (--placebos): as many contrasts as the default leave-one-out's tricks
DEFAULT_PLACEBOS = 6
STREAM_SALT = "rollout.stream_salt"   # the run setting a placebo differs by (decode.sampler_seed)
# A sweep larger than this needs --max-runs: a guard against a factorial that explodes by
# mistake. 128 so that the default question (10 variants with the controls) runs with
# `--seeds auto` up to --max-seeds 12 (120 runs).
DEFAULT_MAX_RUNS = 128


class SweepError(UserError, ValueError):
    """Bad sweep input: the message is the one line the user sees."""


@dataclass
class Matrix:
    mode: str
    variants: list[Variant]
    contrasts: list[Contrast]


@dataclass(frozen=True)
class Job:
    variant: str
    seed: int
    run_dir: str                 # relative to the sweep dir: "<variant>-s<seed>"
    overrides: tuple[str, ...]   # the full `grpo-ablate train` overrides of this run


# ------------------------------------------------------------------------------- matrix
def trick_overrides(tricks) -> tuple[str, ...]:
    """The override that switches named tricks on (none for the bare base)."""
    return (f"+trick=[{','.join(tricks)}]",) if tricks else ()


def _variant(name: str, tricks, reference: str | None) -> Variant:
    return Variant(name, tuple(tricks), trick_overrides(tricks), reference)


def check_known(tricks: list[str], families: dict[str, str]) -> None:
    unknown = [t for t in tricks if t not in families]
    if unknown:
        raise SweepError(f"unknown trick{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                         f"allowed: {', '.join(sorted(families))} (see `grpo-ablate tricks`)")
    duplicated = sorted({t for t in tricks if tricks.count(t) > 1})
    if duplicated:
        raise SweepError(f"trick {', '.join(duplicated)} is listed twice in --tricks")


def check_exclusive(tricks: list[str], families: dict[str, str]) -> None:
    """Tricks that set the same family are alternatives: one run cannot have both on."""
    by_family: dict[str, list[str]] = {}
    for t in tricks:
        by_family.setdefault(families[t], []).append(t)
    for family, names in by_family.items():
        if len(names) > 1:
            raise SweepError(f"tricks {' and '.join(names)} both set family '{family}', so they cannot be "
                             f"on together in one run; keep one (compare the options of a family with "
                             f"`sweep factorial --family {family}`)")


def build_matrix(mode: str, tricks: list[str], families: dict[str, str],
                 axes: list[tuple[str, list]] | None = None, reward_terms: frozenset[str] = frozenset(),
                 placebos: int = DEFAULT_PLACEBOS) -> Matrix:
    """Variants and contrasts of a sweep. `families` maps every named trick to its family;
    `axes` (factorial only) lists (config key or group, values) to cross instead of tricks;
    `reward_terms` (conflict only): the named tricks whose option adds a term to the reward (the
    registry's shapes_reward flag). A conflict sweep's `tricks` are [the trick, the reward term].
    `placebos` (aa only): how many placebo variants beside the reference."""
    tricks = list(tricks)
    if mode not in MODES:
        raise SweepError(f"sweep mode {mode!r} is not allowed; allowed: {', '.join(MODES)}, file")
    check_known(tricks, families)
    if mode == "factorial" and axes:
        if tricks:
            raise SweepError("factorial takes either --tricks (on/off combinations) or --family "
                             "(option combinations), not both")
        return _family_factorial(axes)
    if mode == "aa":
        check_exclusive(tricks, families)
        return placebo_matrix(tricks, placebos)
    if not tricks:
        raise SweepError(f"sweep {mode} needs tricks: --tricks a,b,c (see `grpo-ablate tricks`)")
    if mode == "leave-one-out":
        check_exclusive(tricks, families)
        variants = [_variant("all", tricks, None)]
        variants += [_variant(f"drop-{t}", [u for u in tricks if u != t], "all") for t in tricks]
        contrasts = [Contrast(t, "all", f"drop-{t}") for t in tricks]
    elif mode == "add-one-in":   # each trick alone: alternatives of one family may both be listed
        variants = [_variant("base", [], None)] + [_variant(f"add-{t}", [t], "base") for t in tricks]
        contrasts = [Contrast(t, f"add-{t}", "base") for t in tricks]
    elif mode == "ladder":
        # cumulative; a rung whose trick sets a family an earlier rung set replaces it (DAPO's
        # soft overlong punishment replaces overlong filtering in its table)
        names = ["base"] + [f"rung{i}-{t}" for i, t in enumerate(tricks, 1)]
        variants, on = [_variant("base", [], None)], []
        for i, t in enumerate(tricks, 1):
            on = [u for u in on if families[u] != families[t]] + [t]
            variants.append(_variant(names[i], on, names[i - 1]))
        contrasts = [Contrast(t, names[i], names[i - 1]) for i, t in enumerate(tricks, 1)]
    elif mode == "pairwise":
        check_exclusive(tricks, families)
        if len(tricks) < 2:
            raise SweepError("sweep pairwise needs at least two tricks: --tricks a,b[,c...]")
        variants = [_variant("base", [], None)] + [_variant(t, [t], "base") for t in tricks]
        variants += [_variant(f"{a}+{b}", [a, b], "base") for a, b in itertools.combinations(tricks, 2)]
        contrasts = [Contrast(t, t, "base") for t in tricks]   # each trick's effect at the base
    elif mode == "conflict":
        return _conflict(tricks, reward_terms)
    else:  # factorial over on/off
        check_exclusive(tricks, families)
        variants = []
        for on in itertools.product((False, True), repeat=len(tricks)):
            chosen = [t for t, o in zip(tricks, on) if o]
            variants.append(_variant("+".join(chosen) or "base", chosen, None if not chosen else "base"))
        # each trick's simple effect at the base: the trick alone vs nothing
        contrasts = [Contrast(t, t, "base") for t in tricks]
    return Matrix(mode, variants, contrasts)


def placebo_matrix(tricks: list[str], placebos: int) -> Matrix:
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


def _conflict(tricks: list[str], reward_terms: frozenset[str]) -> Matrix:
    """The seed review's check before combining a new trick with a new reward term: run the
    base, base + trick and base + reward term separately (never both on), with the gradient
    diagnostics, and combine them only if they pull the same way."""
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


def variants_matrix(variants: dict) -> Matrix:
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


# ------------------------------------------------------------------------------- labels
def split_top_level(text: str) -> list[str]:
    """`a,b` -> [a, b]; commas inside [...], {...} or quotes stay in their item (a list value)."""
    items, depth, quote, current = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(current.strip())
            current = ""
            continue
        current += ch
    return items + [current.strip()]


def value_label(key: str, value) -> str:
    """A config group's option stands for itself (`grpo`); a key's value says whose it is, joined
    by a hyphen (`wrong-1`, `wrong--1`: a value and its negative never share a name); a list's
    items are joined by `_` (`betas-0.9_0.99`)."""
    text = str(value).lower() if isinstance(value, bool) else str(value)
    text = "_".join(split_top_level(text[1:-1])) if text.startswith("[") and text.endswith("]") else text
    label = text if "." not in key else f"{key.rsplit('.', 1)[1]}-{text}"
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", label)


def override_value(value) -> str:
    """A value as an override writes it (`true`, not `True`)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


# ------------------------------------------------------------------------------- seeds, jobs
def parse_seeds(text: str | int | list) -> list[int]:
    """`3` means seeds 0, 1, 2; `0,5,9` means those seeds."""
    if isinstance(text, list):
        items = [str(s) for s in text]
    else:
        text = str(text).strip()
        items = text.split(",") if "," in text else None
        if items is None:
            if not (text.isascii() and text.isdigit()) or int(text) < 1:   # `²` is a digit to isdigit, not to int
                raise SweepError(f"--seeds {text!r} is not allowed; give a count >= 1 (3 means seeds "
                                 "0,1,2), a comma list of seeds (0,5,9), or auto (sweep: seeds until each "
                                 "contrast is decided)")
            return list(range(int(text)))
    seeds = []
    for item in items:
        item = item.strip()
        if not (item.isascii() and item.isdigit()):
            raise SweepError(f"--seeds {','.join(items)!r} is not allowed; every seed must be an "
                             "integer >= 0")
        seeds.append(int(item))
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"--seeds {','.join(items)} lists a seed twice")
    return seeds


def check_size(matrix: Matrix, seeds: list[int], max_runs: int) -> None:
    runs = len(matrix.variants) * len(seeds)
    if runs > max_runs:
        raise SweepError(f"this {matrix.mode} sweep is {len(matrix.variants)} variants x {len(seeds)} "
                         f"seeds = {runs} runs, above the limit of {max_runs}; raise it with "
                         f"--max-runs {runs} or sweep fewer tricks")


def expand_jobs(matrix: Matrix, seeds: list[int], common: list[str], labels: dict) -> list[Job]:
    """Every (variant, seed) as a job, seed-major, so the first results cover every variant.

    `labels`: sweep name, id, W&B group and the sweep's tricks; they go into each run's
    config (`run.*`, `sweep.*`) so W&B groups and compares the runs with no manual setup.
    """
    jobs = []
    for seed in seeds:
        for v in matrix.variants:
            name = f"{v.name}-s{seed}"
            job_labels = [
                f"run.name={name}", f"run.group={labels['group']}", f"run.job_type={v.name}",
                f"run.tags=[{','.join(v.tricks_on)}]",
                f"sweep.name={labels['name']}", f"sweep.id={labels['id']}", f"sweep.mode={matrix.mode}",
                f"sweep.variant={v.name}", f"sweep.tricks=[{','.join(labels['tricks'])}]",
                *([f"sweep.context={v.context}"] if v.context else []),
            ]
            jobs.append(Job(v.name, seed, name, (*common, *v.overrides, f"seed={seed}", *job_labels)))
    return jobs
