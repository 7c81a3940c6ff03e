"""The ablation matrix, pure Python and unit-tested: variants, contrasts, jobs, seeds.

A sweep mode (modes.py) turns named tricks into variants and the contrasts that measure each trick;
`expand_jobs` crosses the variants with seeds into every run's exact `grpo-ablate train` overrides.
Planning is plan.py's; contexts are contexts.py's.
Design: docs/sweeps.md#the-matrix-variants-contrasts-jobs (what each mode builds).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from grpo_ablate.design import Contrast, Variant
from grpo_ablate.errors import UserError


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


def check_size(matrix: Matrix, seeds: list[int], max_runs: int, fewer: str = "tricks") -> None:
    check_runs(matrix.mode, len(matrix.variants), seeds, max_runs, fewer)


def check_runs(mode: str, variants: int, seeds: list[int], max_runs: int, fewer: str = "tricks") -> None:
    """A sweep of `variants` x seeds runs is refused above the run limit (`fewer`: what to sweep fewer of)."""
    runs = variants * len(seeds)
    if runs > max_runs:
        raise SweepError(f"this {mode} sweep is {variants} variants x {len(seeds)} "
                         f"seeds = {runs} runs, above the limit of {max_runs}; raise it with "
                         f"--max-runs {runs} or sweep fewer {fewer}")


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
