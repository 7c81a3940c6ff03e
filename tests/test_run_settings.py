"""Every setting declared once with its `Allowed` (grpo_ablate/config/run_settings.py for the run's own,
the registry for a trick's knobs), and every value outside a declaration refused through the CLI in
one line, exit 2, before anything is written: the cases are generated from the declarations
(tests/out_of_range.py), so a new setting is covered the day it is declared."""
import functools
from importlib import resources

import pytest
from omegaconf import OmegaConf

from conftest import cli, cli_here
from grpo_ablate.config.compose import CONFIG_MODULE, _leaf_keys, compose
from grpo_ablate.config.validate import family_keys, trick_families
from grpo_ablate.config.run_settings import EXEMPT, RUN_SETTINGS
from grpo_ablate.tricks import option, options
from grpo_ablate.tricks.registry import family_info
from out_of_range import out_of_range
from test_faults import refused, snapshot

GROUPS = ("model", "task", "rollout", "logger", "control")   # the config groups that are not trick families


def group_options(group: str) -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(CONFIG_MODULE).joinpath(group).iterdir()
                  if p.name.endswith(".yaml"))


@functools.cache
def composed(*overrides: str):
    return compose(list(overrides))


def undeclared(overrides: list[str]) -> list[str]:
    cfg = OmegaConf.to_container(compose(overrides))
    families = set(trick_families())
    return [k for k in _leaf_keys(cfg) if k.split(".")[0] not in families and k not in RUN_SETTINGS
            and not k.startswith(tuple(EXEMPT))]


@pytest.mark.parametrize("group", GROUPS)
def test_every_key_of_every_group_option_is_declared(group):
    missing = {name: undeclared([f"{group}={name}"]) for name in group_options(group)}
    assert not any(missing.values()), f"declare these in grpo_ablate/config/run_settings.py: {missing}"


def _where(key: str) -> list[str]:
    """Overrides under which the composed config has `key` (rollout.lean_decoder: rollout=hf)."""
    if has(composed(), key) or key.split(".")[0] not in GROUPS:
        return []
    group = key.split(".")[0]
    for name in group_options(group):
        if has(composed(f"{group}={name}"), key):
            return [f"{group}={name}"]
    return [f"{group}={group_options(group)[0]}", f"++{key}=null"]


def has(cfg, key: str) -> bool:
    return OmegaConf.select(cfg, key, default=KeyError) is not KeyError


def run_setting_cases() -> list:
    return [pytest.param(_where(key) + [f"++{key}={value}"], key, id=f"{key}={value}")
            for key, allowed in RUN_SETTINGS.items() for value in out_of_range(allowed)]


def knob_cases() -> list:
    """Every knob of every trick option and every family setting it takes (as config/validate.py checks them)."""
    cases = []
    for family in trick_families():
        info = family_info(family)
        for name in options(family):
            chosen = option(family, name)
            for key in family_keys(OmegaConf.create({family: {"name": name}}), family):
                allowed = chosen.ranges.get(key) or info.settings[key][0]
                cases += [pytest.param([f"{family}={name}", f"++{family}.{key}={value}"], f"{family}.{key}",
                                       id=f"{family}={name} {family}.{key}={value}")
                          for value in out_of_range(allowed)]
    return cases


def refused_in_one_line(tmp_path, overrides, needle):
    (tmp_path / "keep.txt").write_text("x")
    before = snapshot(tmp_path)
    line = refused(cli_here("train", *overrides, cwd=tmp_path), needle)
    assert snapshot(tmp_path) == before
    return line


# ~0.3 s a case in process, ~1100 cases: every 50th on the fast tier (a spread over the declarations),
# the rest on the slow one
CASES = run_setting_cases() + knob_cases()
FAST_SAMPLE = CASES[::50]


@pytest.mark.parametrize("overrides, needle", FAST_SAMPLE)
def test_a_value_out_of_its_declared_range_is_refused(tmp_path, overrides, needle):
    refused_in_one_line(tmp_path, overrides, needle)


@pytest.mark.slow
@pytest.mark.parametrize("overrides, needle", [c for i, c in enumerate(CASES) if i % 50])
def test_every_value_out_of_its_declared_range_is_refused(tmp_path, overrides, needle):
    refused_in_one_line(tmp_path, overrides, needle)


def test_a_generated_case_is_refused_by_a_process_too(tmp_path):
    """One sample through a real process: the in-process runner is the same code path."""
    before = snapshot(tmp_path)
    refused(cli("train", "optim.betas=[1.5,0.99]", cwd=tmp_path), "optim.betas=[1.5, 0.99] is not allowed; "
                                                                   "it must be a list of 2 numbers in [0, 1)")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("overrides, needle", [
    # tracebacks with exit 1 and a run dir left behind, before the run's settings were declared
    ("optim.weight_decay=-1", "optim.weight_decay=-1 is not allowed; it must be a number >= 0"),
    ("optim.betas=[1.5,0.99]", "optim.betas=[1.5, 0.99] is not allowed; it must be a list of 2 numbers in [0, 1)"),
    ("optim.betas=[0.9]", "optim.betas=[0.9] is not allowed; it must be a list of 2 numbers in [0, 1)"),
    ("optim.warmup_steps=abc", "optim.warmup_steps='abc' is not allowed; it must be an integer >= 0"),
    ("eval.max_new_tokens=abc", "eval.max_new_tokens='abc' is not allowed; it must be an integer > 0"),
    # silently accepted
    ("optim.warmup_steps=-3", "optim.warmup_steps=-3 is not allowed; it must be an integer >= 0"),
    ("eval.max_new_tokens=0", "eval.max_new_tokens=0 is not allowed; it must be an integer > 0"),
    ("samples_per_log=-1", "samples_per_log=-1 is not allowed; it must be an integer >= 0"),
    ("rollout.lean_decoder=maybe", "rollout.lean_decoder='maybe' is not allowed; allowed: true, false"),
    ("debug.fail_at_step=abc", "debug.fail_at_step='abc' is not allowed; it must be an integer > 0"),
    ("reward.correct=inf", "reward.correct=inf is not allowed; it must be a number (finite"),   # not a divergence
    # knobs that would do everything, or that the chosen option never reads
    ("rollout_correction=rejection rollout_correction.high=-1",
     "rollout_correction.high=-1 would reject every token: metric=k3 is never below 0"),
    ("sampling=advantage_range sampling.reject_min=-100 sampling.reject_max=100",
     "would drop every group: with rollout.group_size=8 every advantage r - mean(r) lies in [-0.875, 0.875]"),
    ("sampling=replace sampling.min_replace_ratio=1", "at 1 no batch is ever usable"),
    ("prompt_pool=difficulty prompt_pool.easy_weight=5",
     "prompt_pool.easy_weight=5 is read only by prompt_pool.draw=weights, and draw=fractions ignores it"),
    ("prompt_pool=difficulty prompt_pool.draw=weights prompt_pool.easy_fraction=0.9",
     "prompt_pool.easy_fraction=0.9 is read only by prompt_pool.draw=fractions, and draw=weights ignores it"),
    ("staleness=fixed rollout_correction=rejection rollout_correction.criteria=[seq_max_k3] "
     "rollout_correction.thresholds=3.0",   # a TypeError traceback before
     "rollout_correction.thresholds=3.0 is not allowed; allowed: a list of one threshold per criterion (1)"),
])
def test_the_hunts_settings_are_refused_in_one_line(tmp_path, overrides, needle):
    refused_in_one_line(tmp_path, overrides.split(), needle)


@pytest.mark.full
def test_a_knob_that_makes_its_option_do_nothing_is_named_before_a_sweep_runs(tmp_path):
    before = snapshot(tmp_path)
    refused(cli_here("sweep", "add-one-in", "--tricks", "overlong_punish", "--seeds", 1, "--steps", 1,
                     "--no-controls", "--dry-run", "++overlong.factor=0", cwd=tmp_path),
            "overlong_punish cannot act with overlong.factor=0 (the penalty is 0 at every length)")
    assert snapshot(tmp_path) == before
