"""The run spec: one run's composed, validated config, frozen and typed; every component below
train()'s first screen receives only its part of it, never the whole config.

    spec = run_spec(cfg)
    spec.rollout.group_size                 a run setting, typed
    spec.tricks["clip"].option.per_sequence_loss    the chosen option's registry facts
    spec.tricks["clip"].fn                  its function with the configured knobs bound
    spec.tricks["adv"].values.get("gamma", 1.0)     any key of the family's config group

Design: docs/design.md#the-run-spec-the-config-stops-at-trains-first-screen (where the DictConfig
still travels, and why).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, make_dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

from omegaconf import DictConfig, OmegaConf

from grpo_ablate.config.identity import config_hash
from grpo_ablate.config.run_settings import BASE_SETTINGS, RUN_SETTINGS, setting
from grpo_ablate.config.validate import params, parses_answers
from grpo_ablate.evals.protocol import EvalProtocol
from grpo_ablate.sampling.filters import SamplingFilters
from grpo_ablate.sampling.settings import RolloutSettings
from grpo_ablate.tricks import Option, families, option
from grpo_ablate.tricks.registry import family_info


@dataclass(frozen=True)
class BoundOption:
    """A trick family's chosen option, bound: what the trainer calls for that family."""
    option: Option                 # the registry's entry: its flags (`stale`, `replays`, ...), knobs, impl
    values: Mapping[str, Any]      # every key of the family's config group but `name`: knobs and settings
    knobs: Mapping[str, Any]       # the option's knobs as configured (the family's settings left out)
    fn: Callable | None            # option.impl with those knobs bound (None: a config-only option)

    def bind(self, **supplied) -> Callable:
        """The function with knobs the trainer supplies (the family's `supplied`: clip's
        dual_clip_c, generator) besides the configured ones; those the option does not take are
        left out (validate refuses a config that would need them)."""
        supplied = {k: v for k, v in supplied.items() if k in self.option.knobs}
        return self.option.bind({**self.knobs, **supplied})

    def has(self, flag: str) -> bool:
        """The option's capability flag (a typo is an AttributeError); a flag registered as a function
        of the family's config values is asked with this run's (kl=in_reward reads pi_old when beta > 0)."""
        value = getattr(self.option, flag)
        return bool(value(self.values) if callable(value) else value)


KIND_TYPES = {"integer": int, "number": float, "numbers": tuple, "bool": bool, "text": str, "choice": Any}


def settings_class(group: str) -> type:
    """The frozen dataclass of one group of conf/config.yaml's own settings, made from their declarations
    (config/run_settings.py's BASE_SETTINGS: a field a setting, typed by its Allowed), so that a setting
    declared there is on the spec without a line here."""
    keys = [key for key in BASE_SETTINGS if key.startswith(group + ".")]
    fields = [(key.split(".", 1)[1], KIND_TYPES.get(RUN_SETTINGS[key].kind, Any)) for key in keys]
    return make_dataclass(f"{group.title()}Settings", fields, frozen=True)


def settings_of(cfg: DictConfig, cls: type, group: str):
    """`cls` (a settings_class) with the group's values, each as its declared kind (betas a tuple, a count an int)."""
    values = {}
    for field in fields(cls):
        value = cfg[group][field.name]
        kind = RUN_SETTINGS[f"{group}.{field.name}"].kind
        values[field.name] = value if value is None or kind not in ("integer", "number", "numbers", "bool") else (
            tuple(value) if kind == "numbers" else KIND_TYPES[kind](value))
    return cls(**values)


RewardScale = settings_class("reward")     # correct: the reward of a verifier's score 1; wrong: of 0
OptimSettings = settings_class("optim")    # AdamW and the lr schedule
DiagSettings = settings_class("diag")      # gradient-conflict diagnostics


@dataclass(frozen=True)
class UpdateSettings:
    """The `updates` family: optimizer steps per rollout, and the micro-batches of each (None: no split)."""
    mini_batches: int
    epochs: int
    shuffle: bool
    micro_batch_size: int | None = None         # completions per forward and backward
    max_tokens_per_forward: int | None = None   # real tokens per forward


@dataclass(frozen=True)
class Schedule:
    """The run skeleton's (train/run.py): how long, and what happens on which step."""
    steps: int
    eval_every: int
    eval_max_new_tokens: int
    samples_every: int
    samples_per_log: int
    checkpoint_every: int
    fail_at_step: int | None       # debug: an injected failure (tests of sweep isolation)
    nan_loss_at_step: int | None   # debug: an injected divergence
    keep_weights: bool = False     # eval.keep_weights: the policy at every eval step, for `grpo-ablate eval`
    eval_label: str = "accuracy"   # what the console calls eval/accuracy: accuracy (greedy) or avg@n


@dataclass(frozen=True)
class ModelSettings:
    dtype: str | None             # compute dtype (autocast; None: float32); weights stay float32
    attn_implementation: str | None
    fsdp: bool
    gradient_checkpointing: bool
    disable_dropout: bool
    remove_padding: bool
    lora: bool                    # model.lora.r > 0: only LoRA adapters are trained (peft)
    # the model group as models.py's loaders read it by key (model_dir, add_lora); the config
    # layer and the sweep's warm-up call them with the same group (read-only here)
    group: DictConfig


@dataclass(frozen=True)
class ControlSettings:
    name: str                     # none | base | sft | rft
    budget: str | None            # sft: tokens | wall
    wall_s: float | None
    sample: bool                  # base: sample every step (false: the eval alone)


@dataclass(frozen=True)
class RunRecord:
    """What the run dir records about the config (train/run_log.py). `config` is the one place
    the composed DictConfig is kept: config.yaml and W&B's config are written from it."""
    config: DictConfig
    config_hash: str


@dataclass(frozen=True)
class RunSpec:
    seed: int
    threads: int | None
    on_nonfinite: str             # stop | skip
    reward: RewardScale
    rollout: RolloutSettings
    optim: OptimSettings
    updates: UpdateSettings
    schedule: Schedule
    model: ModelSettings
    task: DictConfig              # the task group, for tasks.build_task (its keys are the task's constructor's)
    ref_kl: bool                  # metrics.ref_kl: run pi_ref for the KL metrics even with beta = 0
    diag: DiagSettings
    control: ControlSettings
    eval: EvalProtocol                  # the held-out eval's protocol (evals/protocol.py), its defaults filled in
    tricks: Mapping[str, BoundOption]   # family (and "kl.estimator") -> its bound option
    record: RunRecord

    def needs(self, flag: str) -> bool:
        """Whether any bound option of this run has the capability `flag`: what the trainer must know
        about an option is declared on it and asked this way, so a new option edits no trainer file."""
        return any(bound.has(flag) for bound in self.tricks.values())

    def sampler_head(self) -> int:
        """The size of the sampler's top-k head that a bound option reads on every sampled token (its
        `reads_sampler_head` flag, a function of its config values: score_centering's k); 0: none reads it,
        and the sampler records none."""
        return max((int(bound.option.reads_sampler_head(bound.values)) for bound in self.tricks.values()
                    if bound.has("reads_sampler_head")), default=0)


def run_spec(cfg: DictConfig) -> RunSpec:
    """The spec of a validated config (config.validate first: nothing is checked here)."""
    tricks = bound_options(cfg)   # every family, `updates` too, is read through its bound option
    r, s = cfg.rollout, tricks["updates"].values

    def read(key):   # a setting some options of its group leave out, read as its declaration says
        return setting(cfg, key)

    return RunSpec(
        seed=int(cfg.seed), threads=None if cfg.threads is None else int(cfg.threads),
        on_nonfinite=str(cfg.on_nonfinite), reward=settings_of(cfg, RewardScale, "reward"),
        rollout=RolloutSettings(str(r.backend), int(r.prompts_per_step), int(r.group_size), int(r.max_new_tokens),
                                read("rollout.dtype"), bool(read("rollout.lean_decoder")),
                                str(read("rollout.rng") or "auto"), _read_only(params(r)),   # null: auto
                                SamplingFilters(int(read("rollout.top_k")), float(read("rollout.top_p")),
                                                float(read("rollout.min_p"))),
                                bool(read("rollout.sampling_replay")), int(read("rollout.stream_salt"))),
        optim=settings_of(cfg, OptimSettings, "optim"),
        updates=UpdateSettings(int(s["mini_batches"]), int(s["epochs"]), bool(s["shuffle"]),
                               _count(s.get("micro_batch_size")), _count(s.get("max_tokens_per_forward"))),
        schedule=Schedule(int(cfg.steps), int(cfg.eval.every), int(cfg.eval.max_new_tokens), int(cfg.samples_every),
                          int(cfg.samples_per_log), int(cfg.checkpoint_every), cfg.debug.fail_at_step,
                          cfg.debug.nan_loss_at_step, bool(read("eval.keep_weights")),
                          eval_protocol(cfg).accuracy_label),
        model=ModelSettings(read("model.dtype"), read("model.attn_implementation"),
                            bool(read("model.fsdp")), bool(read("model.gradient_checkpointing")),
                            bool(read("model.disable_dropout")), bool(read("model.remove_padding")),
                            int(read("model.lora.r")) > 0, _frozen_group(cfg.model)),
        task=_frozen_group(cfg.task), ref_kl=bool(cfg.metrics.ref_kl),
        diag=settings_of(cfg, DiagSettings, "diag"),
        control=ControlSettings(str(cfg.control.name), read("control.budget"), read("control.wall_s"),
                                bool(read("control.sample"))),
        eval=eval_protocol(cfg),
        tricks=tricks,
        record=RunRecord(cfg, config_hash(cfg)))   # the caller's config, written as it was given


def eval_protocol(cfg: DictConfig) -> EvalProtocol:
    """The run's eval protocol, its defaults filled in (maj@k where the task parses answers)."""
    return EvalProtocol.from_group(cfg.eval).resolved(parses_answers(cfg.task.name))


def bound_options(cfg: DictConfig) -> Mapping[str, BoundOption]:
    """Every trick family's chosen option, bound. A dotted family ("kl.estimator") is a key of its
    parent's group naming an option of its own, without knobs; bound where the group has the key."""
    bound = {}
    for family in families():
        parent, _, key = family.partition(".")
        if not key:
            bound[family] = bound_option(cfg, family)
        elif cfg[parent].get(key) is not None:
            chosen = option(family, cfg[parent][key])
            bound[family] = BoundOption(chosen, MappingProxyType({}), MappingProxyType({}), chosen.impl)
    return MappingProxyType(bound)


def bound_option(cfg: DictConfig, family: str) -> BoundOption:
    """The family's chosen option: its knobs are the group's keys but `name` and the family's own
    settings (registry.declare_family: the trainer reads those itself)."""
    chosen, values = option(family, cfg[family].name), params(cfg[family])
    knobs = {k: v for k, v in values.items() if k not in family_info(family).settings}
    return BoundOption(chosen, _read_only(values), _read_only(knobs),
                       chosen.bind(knobs) if chosen.impl is not None else None)


def _frozen_group(node: DictConfig) -> DictConfig:
    """A read-only copy of a config group, its interpolations resolved (struct, as Hydra's: a
    missing key reads None with .get and raises on attribute access)."""
    group = OmegaConf.create(OmegaConf.to_container(node, resolve=True))
    OmegaConf.set_struct(group, True)
    OmegaConf.set_readonly(group, True)
    return group


def _count(value) -> int | None:
    return None if value is None else int(value)


def _read_only(mapping: dict) -> Mapping:
    return MappingProxyType(dict(mapping))
