"""A command's options (sweep, doctor) are declared once, on its request's fields (request_fields.py): the typer
signature, the early checks, the sweep file's keys and --resume's refusals all read them."""
from dataclasses import fields

import pytest
from typer.testing import CliRunner

from grpo_ablate.cli.app import app
from grpo_ablate.request_fields import flags
from grpo_ablate.cli.requests import EvalArgs, ReportRequest
from grpo_ablate.sweep.requests import SWEEP_FILE_FIELDS, DoctorArgs, SweepArgs
from grpo_ablate.sweep.matrix import SweepError
from grpo_ablate.sweep.modes import MODES


@pytest.mark.parametrize("command, request_class", [("sweep", SweepArgs), ("doctor", DoctorArgs), ("eval", EvalArgs),
                                                    ("report", ReportRequest)])
def test_every_declared_option_is_in_help_with_its_help_text(command, request_class):
    text = " ".join(CliRunner().invoke(app, [command, "--help"], terminal_width=400).output.split())
    for name, flag in flags(request_class).items():
        assert " ".join(flag.help.split()) in text, name
        assert flag.argument or flag.shown(name) in text, name


def test_the_sweep_modes_in_help_are_the_matrix_modes():
    text = " ".join(CliRunner().invoke(app, ["sweep", "--help"], terminal_width=400).output.split())
    assert " | ".join(MODES) + " | file PATH" in text


def test_a_sweep_option_a_file_may_set_is_a_sweep_file_key_with_the_same_range():
    for name, flag in flags(SweepArgs).items():
        assert (name in SWEEP_FILE_FIELDS) == flag.file, name
        if flag.file:
            assert SWEEP_FILE_FIELDS[name] is flag.allowed
    assert {"overrides", "families", "variants", "contexts", "expected_pairs"} <= set(SWEEP_FILE_FIELDS)


@pytest.mark.parametrize("request_class", [SweepArgs, DoctorArgs])
def test_every_field_but_the_extra_arguments_is_a_declared_option(request_class):
    assert {f.name for f in fields(request_class)} - set(flags(request_class)) == {"args"}


@pytest.mark.parametrize("request_class, name, flag", [
    (cls, n, f) for cls in (SweepArgs, DoctorArgs) for n, f in flags(cls).items() if f.check])
def test_a_checked_option_is_refused_before_anything_heavy_with_its_flag(request_class, name, flag):
    with pytest.raises(ValueError, match=f"^{flag.decls[0]} 0 is not allowed"):
        request_class(**{name: 0}).check()


def test_resume_refuses_what_the_plan_fixed_and_names_what_may_change():
    from grpo_ablate.sweep.command import resume

    refused = {name: flag for name, flag in flags(SweepArgs).items() if flag.resume == "refused"}
    given = {name: True if flag.default is False else "x" for name, flag in refused.items()}
    with pytest.raises(SweepError) as err:
        resume(SweepArgs(resume_dir="nowhere", **given), console=None)
    message = str(err.value)
    assert "drop " + ", ".join(flag.shown(name) for name, flag in refused.items()) + " (only" in message
    kept = [flag.decls[0] for flag in flags(SweepArgs).values() if flag.resume == "kept"]
    assert all(k in message for k in kept if k not in ("--resume", "--rerun")), message
