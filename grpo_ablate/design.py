"""The experimental design a sweep writes and a report reads: variants, contrasts, contexts.

One typed model of "what is compared", shared by sweep/ (which builds it and writes it into
manifest.json with `to_json`) and report/ (which reads it back once with `from_json`), so the two
never disagree on a field's name or default. Standard library only: `grpo-ablate report` imports
it, and must stay free of torch (and planning a sweep of pandas).
"""
from __future__ import annotations

from dataclasses import dataclass, field

# The no-RL controls a sweep can plan, control=<role> -> the variant's name (sweep/controls.py
# plans them, report/load.py recognises them): the untrained start, supervised training on the
# task's gold solutions, and rejection-sampling fine-tuning on the policy's own verified samples
CONTROLS = {"base": "control-base", "sft": "control-sft", "rft": "control-rft"}
# The run setting a placebo differs by (sampling/decode.sampler_seed): an A/A sweep's arms are the
# reference and copies of it that draw their own sampling stream, and nothing else
STREAM_SALT = "rollout.stream_salt"


def _strings(values) -> tuple[str, ...]:
    """A manifest's list as a tuple of strings; a missing or null list (older sweeps) as ()."""
    return tuple(str(v) for v in values or ())


@dataclass(frozen=True)
class Variant:
    name: str
    tricks_on: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()     # what makes this variant: named tricks, family options
    reference: str | None = None        # the variant its difference is measured against
    kind: str = "treatment"             # treatment | control
    axes: dict = field(default_factory=dict)   # factorial over families: key -> value
    expect: tuple[str, ...] = ()        # `variants` files: the verdicts a correct report gives it
    context: str | None = None          # the context it runs in (a sweep with contexts)
    contexts: tuple[str, ...] = ()      # `variants` files: the only contexts it runs in (none: all)
    # a control's role (base | sft | rft), which the report works out (report/load.identify_controls); the
    # sweep says it in the overrides (`control=base`) and leaves this unset: its manifests are unchanged
    control: str | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "tricks_on": list(self.tricks_on), "overrides": list(self.overrides),
                "reference": self.reference, "kind": self.kind, **({"axes": self.axes} if self.axes else {}),
                **({"expect": list(self.expect)} if self.expect else {}),
                **({"context": self.context} if self.context else {}),
                **({"control": self.control} if self.control else {})}

    @classmethod
    def from_json(cls, data: dict) -> Variant:
        """The inverse of to_json, tolerant of older manifests: lists missing or null, no kind."""
        return cls(name=str(data["name"]), tricks_on=tuple(data.get("tricks_on") or ()),
                   overrides=_strings(data.get("overrides")), reference=data.get("reference"),
                   kind=data.get("kind") or "treatment", axes=dict(data.get("axes") or {}),
                   expect=_strings(data.get("expect")),
                   context=str(data["context"]) if data.get("context") else None,
                   control=str(data["control"]) if data.get("control") else None)


@dataclass(frozen=True)
class Contrast:
    """The effect of `trick` = metric(variant `with_`) - metric(variant `without`). In a sweep
    with contexts, `trick` names the contrast (`<trick>@<context>`), `tests` the trick itself."""
    trick: str
    with_: str
    without: str
    context: str | None = None
    tests: str | None = None

    @property
    def tested(self) -> str:
        """The trick (or variant) this contrast measures, whatever context it is in."""
        return self.tests or self.trick

    def to_json(self) -> dict:
        return {"trick": self.trick, "with": self.with_, "without": self.without,
                **({"context": self.context, "tests": self.tested} if self.context else {})}

    @classmethod
    def from_json(cls, data: dict) -> Contrast:
        """The inverse of to_json; `data` must have trick, with and without (load.py skips one without)."""
        return cls(str(data["trick"]), str(data["with"]), str(data["without"]),
                   context=str(data["context"]) if data.get("context") else None,
                   tests=str(data["tests"]) if data.get("tests") else None)


@dataclass(frozen=True)
class Context:
    """One setting the whole matrix is repeated in: a name and the overrides that make it."""
    name: str
    overrides: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {"name": self.name, "overrides": list(self.overrides)}

    @classmethod
    def from_json(cls, data: dict) -> Context:
        return cls(str(data["name"]), _strings(data.get("overrides")))


def manifest_variants(manifest: dict) -> list[Variant]:
    """The variants a manifest.json holds, typed (the sweep's readers and the report's alike)."""
    return [Variant.from_json(v) for v in manifest.get("variants") or []]


def differ_only_by_stream(a: Variant, b: Variant) -> bool:
    """Two arms that differ by nothing but their sampling stream (a placebo and its reference):
    the same tricks, and overrides that differ only in STREAM_SALT."""
    differing = set(a.overrides) ^ set(b.overrides)
    return a.tricks_on == b.tricks_on and bool(differing) and all(
        o.split("=", 1)[0].lstrip("+") == STREAM_SALT for o in differing)
