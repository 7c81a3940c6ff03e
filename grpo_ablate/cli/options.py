"""The command line's options as typer reads them.

`takes(SweepArgs)` gives a command the signature built from its request's declared fields
(request_fields.py: flag, default, help), so those options are written once, on the request
(sweep, doctor, eval, report). `train`'s two options and `tricks`' one are typer objects here,
named <COMMAND>_<PARAMETER>.
"""
import inspect
import typing
from typing import List, Optional

import typer

from grpo_ablate.request_fields import flags

# train
TRAIN_RESUME = typer.Option(
    None, "--resume", help="Continue the run in this run dir from its last checkpoint.")
TRAIN_RESTART = typer.Option(False, "--restart", help="With --resume: start the run over from step 0 (one "
    "that stopped before its first checkpoint, or whose checkpoint is damaged); "
    "a finished run is never restarted.")

# tricks
TRICKS_FMT = typer.Option("table", "--format", help="table, json or md")

def typer_parameters(request) -> list[inspect.Parameter]:
    """The typer parameters of a request class whose fields are declared with request_fields.option:
    flag, default and help from the field, the type from its annotation (a tuple of texts is a
    repeatable option, which typer gives as a list)."""
    hints = typing.get_type_hints(request)
    params = []
    for name, flag in flags(request).items():
        hint = hints[name]
        if hint == tuple[str, ...]:
            hint = List[str]
        elif tuple[str, ...] in typing.get_args(hint):
            hint = Optional[List[str]]
        info = (typer.Argument(flag.default, help=flag.help) if flag.argument
                else typer.Option(flag.default, *flag.decls, help=flag.help))
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=hint))
    return params


def takes(request):
    """A command `def cmd(ctx, **options)` whose options are `request`'s declared fields: typer
    reads the signature built here, so the options are written once, on the request."""
    def declare(command):
        ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
        command.__signature__ = inspect.Signature([ctx, *typer_parameters(request)], return_annotation=None)
        return command
    return declare
