"""Which no-RL controls a sweep plans, and in which contexts (the untrained base, SFT, RFT).

A trick verdict compares ways of training; it does not say whether training helped at all. So
every sweep carries, per context, the untrained base: an eval of that context's warm start,
with no training and no sampling (`control=base control.sample=false`, about one eval's cost a
run). The report tests the sweep's reference variant against it in each context before any
trick verdict (report/training.py).

The equal-budget SFT control costs a run of its own per seed and context: 0.67 of a GRPO run's
wall time in the issue's easy/hard sweep, 18% of that sweep's run time, the base control 0.04
of a run, 1% (docs/controls.md). Across contexts it
costs, relative to the sweep, what it costs in the same sweep without them (one SFT run per
seed of each copy of the matrix), which is the single-context default already: so it runs
unasked wherever every run trains the embedded model. For a model.path model (in the base or
a context) it runs when asked (`--controls`, a sweep file's `controls: true`). A factorial over
config groups (`--family`) and the diagnoses (doctor, conflict) get no control unless asked.
The RFT control (rejection sampling on the policy's own verified samples, about a GRPO run's
cost) runs wherever the SFT control would, and also where the task has no gold solutions: it
needs only the verifier.
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
