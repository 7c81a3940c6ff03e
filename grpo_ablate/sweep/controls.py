"""Which no-RL controls a sweep plans, and in which contexts (the untrained base, SFT, RFT).

Every sweep carries, per context, the untrained base (an eval of the warm start, no training, no
sampling), which the report tests the reference against before any trick verdict
(report/training.py). The SFT and RFT controls run unasked only where every run trains the
embedded model; diagnoses and `--family` factorials get none unless asked (`control_kinds`).
Design: docs/controls.md#what-runs (which control runs where, what each costs, and why)
"""
from __future__ import annotations

from dataclasses import replace

from grpo_ablate.design import CONTROLS, Variant
from grpo_ablate.sweep.matrix import Matrix

# the base control a sweep plans: the eval of the start alone (train/controls.py)
BASE_OVERRIDES = ("control=base", "control.sample=false")


def control_kinds(asked: bool | None, cheap_training: bool, unasked_none: bool) -> tuple[str, ...]:
    """The controls to plan: `asked` is --controls/--no-controls (None: the default);
    `cheap_training`: the training controls (SFT, RFT) run unasked (every run trains the embedded
    model); `unasked_none`: no control unless asked (doctor's stages and the conflict check, which
    are diagnoses; a `--family` factorial, which crosses settings with no trick under test)."""
    if asked is False or (asked is None and unasked_none):
        return ()
    return tuple(CONTROLS) if asked or cheap_training else ("base",)


def control_variants(kinds: tuple[str, ...], sft_budget: str = "tokens",
                     sft_contexts: tuple[str, ...] = ()) -> list[Variant]:
    """The controls as variants (kind control) of a matrix not yet put in contexts;
    `sft_contexts`: the only contexts whose task has reference solutions to train on (empty: all)."""
    overrides = {"base": BASE_OVERRIDES,
                 "sft": ("control=sft", *(("control.budget=wall",) if sft_budget == "wall" else ())),
                 "rft": ("control=rft",)}
    return [Variant(CONTROLS[k], (), overrides[k], None, kind="control",
                    contexts=sft_contexts if k == "sft" else ()) for k in kinds]


def with_controls(matrix: Matrix, kinds: tuple[str, ...], sft_budget: str = "tokens",
                  sft_contexts: tuple[str, ...] = ()) -> Matrix:
    """`matrix` with its controls appended; with_contexts then copies them into every context."""
    return replace(matrix, variants=matrix.variants + control_variants(kinds, sft_budget, sft_contexts))


def planned_controls(variants: list) -> dict:
    """The manifest's `controls`: role -> the control's name (`control-base`); in a sweep
    across contexts each context's copy is `<name>@<context>` (control_in)."""
    names = [v.name for v in variants]
    return {role: name for role, name in CONTROLS.items()
            if any(n == name or n.startswith(name + "@") for n in names)}


def control_in(controls: dict, role: str, context: str | None) -> str | None:
    """The variant name of the `role` control of `context` (None: a sweep without contexts)."""
    name = controls.get(role)
    return None if name is None else (f"{name}@{context}" if context else name)
