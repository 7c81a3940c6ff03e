"""A family's state lives at one address (train/state/<family>.py): found without a hand list, in the
families' stage order, under the checkpoint keys old runs were written with; and what the trainer must
know about an option is a flag declared on it, asked for without naming a family."""
import importlib
import inspect
import pkgutil
from types import SimpleNamespace

import pytest

from grpo_ablate.config.spec import BoundOption, RunSpec
from grpo_ablate.train import state
from grpo_ablate.train.state import Plugin, factories, stateful
from grpo_ablate.tricks.registry import all_options, declared_families

HOOKS = [name for name, _ in inspect.getmembers(Plugin, inspect.isfunction)]
# Hooks the trainer calls on every active plugin in turn, where more than one family's plugin acts: the
# order is the families' stage order, and for these pairs it does not change the step (say why, or
# order them, before a third family joins).
SHARED = {
    # score norms read the policy's gradients (autograd.grad, no .grad) and the previous policy loads
    # a frozen copy: neither reads what the other writes, and each returns its own anchor fields
    "anchors": {"adv", "kl"},
    # ref_sync mixes the policy's parameters into the reference; the reset clears the optimizer's moments
    "after_optimizer_step": {"ref_sync", "optim_state"},
    # metrics and checkpoints: each family's own keys
    "metrics": {"prompt_pool", "sampling", "adv", "ref_sync", "optim_state", "kl", "entropy"},
    "state_dict": {"prompt_pool", "sampling", "adv", "ref_sync", "optim_state", "kl", "entropy", "temperature"},
    "load_state_dict": {"prompt_pool", "sampling", "adv", "ref_sync", "optim_state", "kl", "entropy",
                        "temperature"},
    # the controllers each update their own weight from the step's metrics, and give their own Coefficients
    "after_metrics": {"kl", "entropy"},
    "coefficients": {"kl", "entropy"},
}


def plugin_classes() -> dict[str, list[type]]:
    """family -> the Plugin classes its train/state module defines."""
    found = {}
    for module in pkgutil.iter_modules(state.__path__):
        loaded = importlib.import_module(f"{state.__name__}.{module.name}")
        found[module.name] = [c for _, c in inspect.getmembers(loaded, inspect.isclass)
                              if issubclass(c, Plugin) and c is not Plugin and c.__module__ == loaded.__name__]
    return found


def test_every_state_module_is_a_declared_family_and_the_factories_follow_the_stages():
    stages = [family.name for family in declared_families()]
    marked = [family for family, _ in factories()]
    assert set(plugin_classes()) == set(marked) <= set(stages)
    assert marked == sorted(marked, key=stages.index)
    # today's hook order: the prompts, the sampler's batch, the estimator, the anchors, then the optimizer
    assert [make.__name__ for _, make in factories()] == [
        "prompt_pool", "replay_buffer", "replace_flat_groups", "ema_baseline", "score_norm_plugin",
        "episode_gap_plugin", "entropy_control", "kl_control", "previous_policy", "reference_sync", "staleness",
        "temperature_control", "optimizer_reset"]


def test_a_hook_several_families_implement_is_one_whose_order_was_looked_at():
    overriding = {hook: {family for family, classes in plugin_classes().items()
                         if any(hook in vars(c) for c in classes)} for hook in HOOKS}
    shared = {hook: families for hook, families in overriding.items() if len(families) > 1}
    assert shared == SHARED, "a hook now has plugins of several families: state whether their order matters"


def test_the_checkpoint_keys_stay_those_old_runs_were_written_with():
    keys = {c.key for classes in plugin_classes().values() for c in classes if c.key}
    assert keys == {"prompt_pool", "replay_buffer", "ema_baseline", "reference_sync", "optimizer_reset",
                    "kl_control", "entropy_control", "temperature"}


def test_a_factory_outside_its_familys_module_is_refused():
    def elsewhere(spec, task, policies):
        return None
    with pytest.raises(ValueError, match="lives in grpo_ablate.train.state.adv"):
        stateful("adv")(elsewhere)


def test_the_options_that_need_pi_olds_forward_are_those_the_trainer_named_before():
    """needs_old_forward, declared on each option, asks for pi_old's forward exactly where the trainer's
    own rule did: a sampler compared with pi_old (rollout_correction, lr_scale, off_policy_mask), a
    stale sampler, the KL charged to the reward with beta > 0. A correction that compares the sampler with
    the current policy instead (`reads_current_policy`: the combined ratio of a trainer without pi_old,
    added after that rule) asks for none."""
    def before(o, values):
        return (o.family in ("rollout_correction", "lr_scale", "off_policy_mask") and o.needs_sampler_logprobs
                and not o.reads_current_policy
                or o.stale or o.family == "kl" and o.name == "in_reward" and values["beta"] > 0)

    for o in all_options():
        for beta in (0.0, 0.04):
            values = {"beta": beta}
            bound = BoundOption(o, values, {}, None)
            assert bound.has("needs_old_forward") == bool(before(o, values)), f"{o.family}={o.name} beta={beta}"


def test_the_trainer_asks_the_spec_not_a_family():
    tricks = {family: BoundOption(o, {"beta": 0.1}, {}, None) for family, o in
              (("a", next(o for o in all_options() if o.family == "lr_scale" and o.name == "none")),
               ("b", next(o for o in all_options() if o.family == "staleness" and o.name == "fixed")))}
    spec = SimpleNamespace(tricks=tricks)
    assert RunSpec.needs(spec, "needs_old_forward") and not RunSpec.needs(spec, "greedy_baseline")
    with pytest.raises(AttributeError, match="not a capability flag"):
        RunSpec.needs(spec, "needs_old_fowrard")
