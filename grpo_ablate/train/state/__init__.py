"""What a trick family remembers between steps: one module per family, `train/state/<family>.py`.

Most options are pure functions bound once (`LossTerms`, `RewardShaping`, `AdvantageChain`). An
option with state that lives across steps and is checkpointed with the run (a prompt pool, a
replay buffer, a baseline carried over, a reference that moves, a controller's beta, coefficient
or trained temperature) brings a `Plugin`, made by a
factory in its family's module here, marked `@stateful(family)`:

    @stateful("sampling")
    def replay_buffer(spec, task, policies) -> ReplayBuffer | None: ...

A factory reads its family's bound option from the run spec (`spec.tricks[family]`: a registry
flag, its knobs, its function) and returns None when the option brings no state. `GRPOTrainer`
calls every active plugin's hooks (`Plugin` below) at fixed points of a step and names none of
them. The plugins come in the order of their families' declared stage (tricks/registry.py
STAGES, then declaration order; a family's own factories in the order its module has them):
the order in which a hook that several families implement sees them. No list is kept by hand:
every module of this package is imported once, the first time the factories are asked for.

The policy's weights k steps ago are one mechanism (`PolicyHistory`, train/policy_history.py):
the trainer keeps one history as deep as the deepest `history_depth` asked for.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable

from grpo_ablate.tricks.registry import declared_families


class Plugin:
    """A stateful option's hooks; each default leaves the step as it is.

        prompts(source)                     the prompt source the step's sampling rounds draw from
        sampler(rollouts, model, history)   this step's sampler (a wrapper around the trainer's)
        after_sampling(batch, step, pad_id) the batch that is trained on
        anchors(part, T, forward, history)  frozen-policy log-probs by `Anchors` field (no gradient)
        estimator_input()                   what the advantage estimator reads (`values`), or None
        after_advantages(rewards)           the rewards the estimator saw, once the advantages are taken
        after_optimizer_step(optimizer)     once after every optimizer step
        after_update(optimizer)             once a rollout's optimizer steps are done
        metrics(batch)                      this step's metrics of its own
        after_metrics(metrics, rows)        once the step's metrics are in (an adaptive controller updates)
        temperature(T)                      the temperature the step samples and scores at (a tensor: trained)
        coefficients()                      this step's weights of the terms it sets (`Coefficients` fields)
        param_groups()                      trained tensors of its own: optimizer groups, outside DDP
        state_dict(), load_state_dict()     checkpointed with the run under `key`
    """

    key: str = ""            # its checkpoint entry (stable: a resumed run finds its state by it)
    history_depth: int = 0   # how many past steps of the policy's weights it reads (0: none)

    def prompts(self, source):
        return source

    def sampler(self, rollouts, model, history):
        return rollouts

    def after_sampling(self, batch, step: int, pad_id: int):
        return batch

    def anchors(self, part, temperature: float, forward, history) -> dict:
        return {}

    def estimator_input(self):
        return None

    def after_advantages(self, rewards) -> None:
        return None

    def after_optimizer_step(self, optimizer) -> None:
        return None

    def after_update(self, optimizer) -> None:
        return None

    def metrics(self, batch) -> dict:
        return {}

    def after_metrics(self, metrics: dict, rows: int) -> None:
        return None

    def temperature(self, T):
        return T

    def coefficients(self) -> dict:
        return {}

    def param_groups(self) -> list[dict]:
        return []

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None


Factory = Callable[..., "Plugin | None"]      # (spec, task, policies) -> the plugin, or None
# (module, name) -> (family, factory), in the order they were marked (a module imported again replaces its own)
_FACTORIES: dict[tuple[str, str], tuple[str, Factory]] = {}


def stateful(family: str) -> Callable[[Factory], Factory]:
    """Mark a factory `(spec, task, policies) -> Plugin | None` as the state of `family`; it lives
    in train/state/<family>.py (a family's state is found at one address)."""
    def mark(factory: Factory) -> Factory:
        home = f"{__name__}.{family}"
        if factory.__module__ != home:
            raise ValueError(f"@stateful({family!r}) {factory.__name__} is in {factory.__module__}: "
                             f"a family's state lives in {home}")
        _FACTORIES[(factory.__module__, factory.__name__)] = (family, factory)
        return factory
    return mark


def factories() -> list[tuple[str, Factory]]:
    """Every (family, factory), by the family's declared stage then declaration order (a family's
    own factories in the order its module marks them). Imports every module of this package once."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    order = [family.name for family in declared_families()]
    marked = list(_FACTORIES.values())
    undeclared = sorted({family for family, _ in marked if family not in order})
    if undeclared:
        raise ValueError(f"@stateful({undeclared[0]!r}): no such trick family (declare_family it in tricks/)")
    return sorted(marked, key=lambda entry: order.index(entry[0]))   # stable: marking order within a family


def active_plugins(spec, task, policies) -> list[Plugin]:
    """The plugins this run's options bring (none for a run of stateless tricks)."""
    return [plugin for _, make in factories() if (plugin := make(spec, task, policies)) is not None]


def extra_param_groups(plugins: list[Plugin]) -> list[dict]:
    """The optimizer groups of tensors the plugins train beside the policy (a learnable temperature)."""
    return [group for plugin in plugins for group in plugin.param_groups()]
