"""The run spec (grpo_ablate/config/spec.py): what train() hands down instead of the config is frozen,
binds every family the registry knows, and binds each as the trainer calls it."""
import dataclasses
import functools

import pytest
from omegaconf import OmegaConf

from grpo_ablate.config.compose import compose
from grpo_ablate.config.spec import run_spec
from grpo_ablate.tricks import families, option


@pytest.fixture(scope="module")
def spec():
    return run_spec(compose(["clip=higher", "clip.eps_high=0.3", "sampling=dynamic", "seed=7"]))


def test_the_spec_cannot_be_changed_below_train(spec):
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.rollout.group_size = 3
    with pytest.raises(TypeError):
        spec.tricks["clip"].values["eps_high"] = 1.0
    with pytest.raises(TypeError):
        spec.tricks["new"] = spec.tricks["clip"]
    with pytest.raises(Exception):      # the model group the loaders read: read-only
        spec.model.group.path = "elsewhere"


def test_every_registered_family_is_bound_so_a_new_family_needs_nothing_here(spec):
    assert set(spec.tricks) == set(families())
    assert spec.tricks["kl.estimator"].fn is option("kl.estimator", "k3").impl


def test_a_bound_option_is_its_function_with_the_configured_knobs(spec):
    clip = spec.tricks["clip"]
    assert clip.option is option("clip", "higher") and clip.values["eps_high"] == 0.3
    assert isinstance(clip.fn, functools.partial) and clip.fn.keywords["eps_high"] == 0.3
    assert "is_weights" not in clip.knobs            # a family setting: the trainer reads it, not the function
    bound = clip.bind(dual_clip_c=3.0, generator=None)   # the trainer's knobs; ppo_clip_loss takes no generator
    assert bound.keywords == {**clip.knobs, "dual_clip_c": 3.0}
    assert spec.tricks["dual_clip"].fn is None        # a config-only option: its settings are read, nothing called
    assert spec.tricks["sampling"].values["max_rounds"] == compose(["sampling=dynamic"]).sampling.max_rounds


def test_the_run_settings_are_typed_and_the_config_is_kept_only_for_the_run_log(spec):
    assert (spec.seed, spec.rollout.group_size, spec.updates.mini_batches) == (7, 8, 1)
    assert isinstance(spec.schedule.steps, int) and spec.schedule.fail_at_step is None
    cfg = spec.record.config
    assert OmegaConf.select(cfg, "clip.eps_high") == 0.3 and len(spec.record.config_hash) == 16
