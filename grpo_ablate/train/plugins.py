"""The stateful tricks a run can bring, in the order the trainer calls their hooks.

Each entry is a factory `(spec, task, policies) -> Plugin | None`, beside its plugin: it reads
its family's bound option from the run spec (`spec.tricks[family]`: a registry flag, `pooled`,
`stale`, `replays`, `replaces_flat_groups`, `syncs_reference`, `resets_optimizer`,
`carries_baseline`, `reads_score_norms`, its knobs and function; or the kl option's
previous-policy anchor), returns None when the option brings no state, and hands its plugin
only what that plugin uses. A new stateful trick adds its factory here; `GRPOTrainer` only
loops over what `active_plugins` returns (train/plugin.py has the protocol).
"""
from __future__ import annotations

from grpo_ablate.spec import RunSpec
from grpo_ablate.train.ema_baseline import ema_baseline
from grpo_ablate.train.history import PolicyHistory, previous_policy
from grpo_ablate.train.optimizer_reset import optimizer_reset
from grpo_ablate.train.plugin import Plugin
from grpo_ablate.train.prompt_pool import prompt_pool
from grpo_ablate.train.reference_sync import reference_sync
from grpo_ablate.train.replace_groups import replace_flat_groups
from grpo_ablate.train.replay import replay_buffer
from grpo_ablate.train.score_norms import score_norm_plugin
from grpo_ablate.train.staleness import staleness

# the order is the order of the hooks' calls: the prompts, then the sampler, then the batch
FACTORIES = (prompt_pool, staleness, replay_buffer, replace_flat_groups, previous_policy, ema_baseline,
             score_norm_plugin, reference_sync, optimizer_reset)


def active_plugins(spec: RunSpec, task, policies) -> list[Plugin]:
    """The plugins this run's options bring (none for a run of stateless tricks)."""
    return [plugin for make in FACTORIES if (plugin := make(spec, task, policies)) is not None]


def policy_history(plugins: list[Plugin]) -> PolicyHistory | None:
    """The one history of the policy's weights, as deep as the deepest plugin reads (else None)."""
    depth = max((plugin.history_depth for plugin in plugins), default=0)
    return PolicyHistory(depth) if depth else None
