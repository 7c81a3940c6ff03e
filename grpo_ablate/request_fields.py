"""A command's options written once: one dataclass field per option, its metadata a `Flag`.

The field's metadata holds everything said about the option — its flag, its help, what it may
be (an `Allowed`), whether it is checked before anything heavy is imported, whether a sweep
file may set the key of the same name, and what `--resume` does with it — so the command's
typer signature (cli/options.py typer_parameters), its request (the dataclass itself), the sweep
file's keys and --resume's refusals are all read from here, not written again. Standard library
and values.py only: the early checks run before the training stack is imported.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from grpo_ablate.allowed import Allowed
from grpo_ablate.values import ValueProblem

# what `--resume` does with an option: refuse it (the plan is the manifest's), use it (how runs
# run), or ignore it (it only ever mattered to planning, and planning is over)
RESUME = ("refused", "kept", "ignored")


@dataclass(frozen=True)
class Flag:
    """One option's declaration; `decls` empty for the positional argument."""
    decls: tuple[str, ...]
    help: str
    default: object = None
    allowed: Allowed | None = None
    check: bool = False      # checked against `allowed` before anything heavy is imported
    file: bool = False       # a sweep file may set it (under the field's name, checked against `allowed`)
    resume: str = "refused"

    def __post_init__(self):
        if self.resume not in RESUME:
            raise ValueError(f"resume={self.resume!r}; allowed: {', '.join(RESUME)}")
        if (self.check or self.file) and self.allowed is None:
            raise ValueError(f"{self.decls}: a checked option or sweep-file key needs `allowed`")

    @property
    def argument(self) -> bool:
        return not self.decls

    def shown(self, name: str) -> str:
        """How a message names the option: `--controls` (of --controls/--no-controls), MODE."""
        return self.decls[0].split("/")[0] if self.decls else name.upper()


def option(*decls: str, help: str, default=None, **declared):
    """A dataclass field that is a command-line option (`declared`: Flag's other fields)."""
    return field(default=default, metadata={"flag": Flag(tuple(decls), help, default, **declared)})


def argument(help: str, default=None, **declared):
    """A dataclass field that is the command's positional argument."""
    return field(default=default, metadata={"flag": Flag((), help, default, **declared)})


def flags(cls) -> dict[str, Flag]:
    """The options of a request class by field name, in declaration order (= the --help order)."""
    return {f.name: f.metadata["flag"] for f in fields(cls) if "flag" in f.metadata}


def was_given(value, default) -> bool:
    """Whether an option was given: not its default, and not an empty text or list
    (`--controls` counts as given when it is --no-controls, whose value False is not the default None)."""
    if isinstance(value, (str, tuple, list)) and not value:
        return False
    return value != default


def check_given(request) -> None:
    """Every option declared `check`: ValueProblem naming the first that is not allowed."""
    for name, flag in flags(type(request)).items():
        value = getattr(request, name)
        if flag.check and (problem := flag.allowed.problem(value, f"{flag.shown(name)} {value}")) is not None:
            raise ValueProblem(problem)


def from_command_line(cls, args, values: dict):
    """The request `cls` from typer's values (lists become tuples: a request is frozen) and the extra
    arguments (None: a command that takes none)."""
    as_given = {name: tuple(value) if isinstance(value, list) else value for name, value in values.items()}
    return cls(**as_given) if args is None else cls(args=tuple(args), **as_given)
