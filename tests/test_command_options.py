"""A command's options are declared once, on its request's fields (cli_fields.py): the typer
signature, the early checks, the sweep file's keys and --resume's refusals all read them."""
from dataclasses import fields

import pytest
from typer.testing import CliRunner

from grpo_ablate.cli import app
from grpo_ablate.cli_fields import flags
from grpo_ablate.requests import SWEEP_FILE_FIELDS, SweepArgs
from grpo_ablate.sweep.matrix import MODES, SweepError


def test_every_declared_sweep_option_is_in_help_with_its_help_text():
    text = " ".join(CliRunner().invoke(app, ["sweep", "--help"], terminal_width=400).output.split())
    for name, flag in flags(SweepArgs).items():
        assert " ".join(flag.help.split()) in text, name
        assert flag.argument or flag.shown(name) in text, name
    assert " | ".join(MODES) in text   # the modes are matrix.MODES, not a second list


def test_a_sweep_option_a_file_may_set_is_a_sweep_file_key_with_the_same_range():
    for name, flag in flags(SweepArgs).items():
        assert (name in SWEEP_FILE_FIELDS) == flag.file, name
        if flag.file:
            assert SWEEP_FILE_FIELDS[name] is flag.allowed
    assert {"overrides", "families", "variants", "contexts", "expected_pairs"} <= set(SWEEP_FILE_FIELDS)


def test_every_field_but_the_extra_arguments_is_a_declared_option():
    assert {f.name for f in fields(SweepArgs)} - set(flags(SweepArgs)) == {"args"}


@pytest.mark.parametrize("name, flag", [(n, f) for n, f in flags(SweepArgs).items() if f.check])
def test_a_checked_option_is_refused_before_anything_heavy_with_its_flag(name, flag):
    with pytest.raises(ValueError, match=f"^{flag.decls[0]} 0 is not allowed"):
        SweepArgs(**{name: 0}).check()


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
