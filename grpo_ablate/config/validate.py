"""Config validation: bad input becomes one clear line, before any run dir (composition: compose.py;
whether this machine can run a valid config: here.py's `check_here`).

`ConfigError` carries the message the CLI prints (what was wrong, what is allowed). The CLI
composes and validates the config before Hydra creates an output directory, so a bad value
never leaves a half-written run dir behind.
"""
from __future__ import annotations

import inspect
import json
import os
import re

from omegaconf import DictConfig, OmegaConf

from grpo_ablate.allowed import Allowed, choice
from grpo_ablate.config.here import check_here  # noqa: F401  (re-exported: the CLI and the trainer check both)
from grpo_ablate.config.run_settings import RUN_SETTINGS, setting
from grpo_ablate.errors import ConfigError
from grpo_ablate.evals.protocol import EvalProtocol
from grpo_ablate.model_source import PACKAGE_PREFIX, ModelPathError, gguf_source, local_path, looks_local
from grpo_ablate.tasks import TASKS
from grpo_ablate.tasks.environment import is_multi_turn
from grpo_ablate.tricks import UnknownOption, families, option, options
from grpo_ablate.tricks.registry import family_info


def params(group: DictConfig) -> dict:
    """A family's options as keyword arguments: everything in its group except `name`."""
    return {k: v for k, v in OmegaConf.to_container(group, resolve=True).items() if k != "name"}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check(key: str, value, allowed: Allowed, cfg: DictConfig | None = None) -> None:
    """The one way a value is checked (grpo_ablate/allowed.py): one line naming what is allowed."""
    problem = allowed.problem(value, f"{key}={value!r}", cfg)
    _require(problem is None, problem or "")


def check_tricks(cfg: DictConfig) -> None:
    """Named tricks (+trick=a,b) each set one family. Hydra lets the last of two tricks that set
    the same family win silently, and a family given on the command line beats a trick; both
    would make a run claim a trick that is not in effect, so both are errors here."""
    by_family: dict[str, list[str]] = {}
    for name, info in (cfg.get("tricks") or {}).items():
        by_family.setdefault(info.family, []).append(name)
    for family, names in by_family.items():
        _require(len(names) == 1, f"tricks {' and '.join(sorted(names))} both set family '{family}'; "
                                  "they are alternatives: pick one")
    for name, info in (cfg.get("tricks") or {}).items():
        actual = cfg[info.family].name
        _require(actual == info.option,
                 f"trick {name} sets {info.family}={info.option}, but {info.family}={actual} was given "
                 f"too; drop one of them")


def trick_families() -> list[str]:
    """Every trick family that is a config group: the registry's (those with functions first,
    then the config-only ones, each sorted)."""
    groups = [f for f in families() if "." not in f]
    return ([f for f in groups if not _config_only(f)] + [f for f in groups if _config_only(f)])


def _config_only(family: str) -> bool:
    return all(o.impl is None for o in options(family).values())


def option_flags(family: str, name: str) -> dict:
    """The capability flags of any option (e.g. off_policy_only, needs_sampler_logprobs), for the
    trainer and the inert-trick rules."""
    return dict(option(family, name).flags)


def family_keys(cfg: DictConfig, family: str) -> list[str]:
    """The keys the family's chosen option may set: its knobs and the family's trainer settings
    (a setting tied to a capability flag only for options that have it)."""
    try:
        chosen = option(family, cfg[family].name)
    except UnknownOption as err:
        raise ConfigError(str(err)) from None
    info = family_info(family)
    allowed = [k for k in chosen.knobs if k not in info.supplied]
    return allowed + [k for k, (_, flag) in info.settings.items() if flag is None or getattr(chosen, flag)]


class _Values:
    """A config's values read as plain data, made once (validation reads hundreds of values, and a
    DictConfig's own read costs ~50 us); an interpolation, a missing value (???), a mapping or a list
    is read from the config itself, as `OmegaConf.select` reads it."""

    def __init__(self, cfg: DictConfig):
        self.cfg, self.plain = cfg, OmegaConf.to_container(cfg, resolve=False)

    def get(self, key: str, default=None, throw_on_missing: bool = False):
        node = self.plain
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        if isinstance(node, (dict, list)) or isinstance(node, str) and ("${" in node or node == "???"):
            return OmegaConf.select(self.cfg, key, default=default, throw_on_missing=throw_on_missing)
        return node


def check_family_keys(cfg: DictConfig, family: str, values: _Values | None = None) -> None:
    """Every key of the family's config is a knob of the chosen option or a trainer key: a
    mistyped key (`+adv.epz=0.1`) is an error naming the allowed ones, never ignored."""
    values = values or _Values(cfg)
    name, allowed = values.get(f"{family}.name"), family_keys(cfg, family)
    for key in values.plain[family]:
        if key == "name" or key in allowed:
            continue
        supplied = family_info(family).supplied.get(key)
        raise ConfigError(f"{family}.{key} is not a setting of {family}={name}"
                          + (f" (it is set by {supplied})" if supplied else "")
                          + f"; allowed: {', '.join(sorted(allowed)) or '(none)'}")


def check_family_values(cfg: DictConfig, family: str, values: _Values | None = None) -> None:
    """Every knob and setting of the family in its declared range (registry.Allowed), then the
    chosen option's own checks across settings (registered with it)."""
    values = values or _Values(cfg)
    chosen, info = option(family, values.get(f"{family}.name")), family_info(family)
    declared = {key: chosen.ranges.get(key) or info.settings[key][0] for key in values.plain[family] if key != "name"}
    # a knob bounded by another of its family's keys (paced: depth <= max_age <= k) is checked after that key,
    # so that a refusal names the key that is wrong
    def after(key: str, seen=()) -> int:
        bounds = [b.split(".", 1)[1] for b in (declared[key].low, declared[key].high)
                  if isinstance(b, str) and b.startswith(f"{family}.")]
        return max((1 + after(b, (*seen, key)) for b in bounds if b in declared and b not in seen), default=0)
    for key in sorted(declared, key=after):
        value = values.get(f"{family}.{key}", throw_on_missing=True)
        _check(f"{family}.{key}", value, declared[key], cfg)
    _require((unread := _unread_knob(family, chosen, values.plain[family])) is None, unread or "")
    for check in chosen.checks:
        problem = check(cfg)
        if problem is not None and not problem.startswith(family):   # every message names its subject
            problem = f"{family}={chosen.name}: {problem}"
        _require(problem is None, problem or "")


def _unread_knob(family: str, chosen, group: dict) -> str | None:
    """A knob set away from its default under a choice of its own option that never reads it (adv=gae's
    alpha, read by lam_fn=vapo alone): refused, as a key the option does not have is."""
    defaults = chosen.config()
    for key, allowed in chosen.ranges.items():
        rule = allowed.reader()
        if rule is None or key not in group or group[key] == defaults.get(key) or rule.reads(group):
            continue
        return (f"{family}.{key}={group[key]} changes nothing with {family}.{rule.key}={group.get(rule.key)}: it is "
                f"read only with {family}.{rule.key}={'|'.join(map(str, rule.values))}; drop it or set "
                f"{family}.{rule.key}")
    return None


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError on the first bad value. Cheap: no model is loaded and no hub dataset read (a local task
    file's rows are, once per file as it is now: a malformed row is refused before a run dir exists)."""
    values = _Values(cfg)
    check_run_settings(cfg, values)     # first: the tricks' checks and bounds read the run's settings
    check_trick_settings(cfg, values)
    check_model_and_task(cfg)


def check_trick_settings(cfg: DictConfig, values: _Values | None = None) -> None:
    """The trick families: options that exist, keys that are their settings, values in their
    declared ranges, the options' own checks (all from the registry), named tricks that agree."""
    values = values or _Values(cfg)
    for family in trick_families():   # the option exists and every key is one of its settings
        check_family_keys(cfg, family, values)
    check_tricks(cfg)
    for family in trick_families():
        check_family_values(cfg, family, values)
    group = cfg.rollout.group_size
    if option("adv", cfg.adv.name).uses_group_statistic:
        _require(isinstance(group, int) and group >= 2,
                 f"rollout.group_size={group!r} is not allowed with adv={cfg.adv.name}: "
                 "a group statistic needs at least 2 completions per prompt (group_size >= 2)")
        _require(setting(cfg, "rollout.top_k") != 1,
                 f"rollout.top_k=1 is not allowed with adv={cfg.adv.name}: it samples greedily, so every completion "
                 "of a group is the same, every advantage is 0 and the run learns nothing; use top_k=0 (off) or > 1")
    if cfg.rollout.get("dtype") is not None and cfg.rollout.backend != "vllm":   # vLLM samples in float16 too
        _check("rollout.dtype", cfg.rollout.dtype, choice("float32", "bfloat16"))


def _interpolated(plain: dict, key: str) -> bool:
    node = plain
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return isinstance(node, str) and "${" in node


def check_run_settings(cfg: DictConfig, values: _Values | None = None) -> None:
    """The run around the tricks: every key of run_settings.RUN_SETTINGS that this config has
    (some belong to one option of a group: rollout=hf's lean_decoder), then the rules across keys."""
    values, absent = values or _Values(cfg), object()
    # a value that is another key's (eval.max_new_tokens: ${rollout.max_new_tokens}) is checked after it,
    # so that a refusal names the key the user gave
    for key, allowed in sorted(RUN_SETTINGS.items(), key=lambda item: _interpolated(values.plain, item[0])):
        value = values.get(key, default=absent)   # ???: the model check's
        if value is not absent:
            _check(key, value, allowed)
    _require(cfg.reward.correct > cfg.reward.wrong,
             f"reward.correct={cfg.reward.correct!r}, reward.wrong={cfg.reward.wrong!r} are not allowed; "
             "they must be numbers with correct > wrong")
    check_eval_protocol(cfg)
    _require(int(cfg.optim.warmup_steps) <= int(cfg.steps),
             f"optim.warmup_steps={cfg.optim.warmup_steps} is not allowed with steps={cfg.steps}: the run would end "
             "before its lr reaches optim.lr; give optim.warmup_steps <= steps")
    _require((idle := _tricks_a_control_ignores(cfg)) is None, idle or "")
    if cfg.control.name == "sft" and cfg.control.budget == "wall":
        _require(cfg.control.wall_s is not None, "control.budget=wall needs control.wall_s (seconds of "
                                                 "supervised training in all)")


CONTROL_READS = ("sampling", "temperature")   # the families a control run reads (train/controls.py samples with them)


def _tricks_a_control_ignores(cfg: DictConfig) -> str | None:
    """A named trick in a control run (no GRPO loss, no advantage, no KL) changes nothing in it."""
    if cfg.control.name == "none":
        return None
    named = {name: info for name, info in (cfg.get("tricks") or {}).items() if info["family"] not in CONTROL_READS}
    if not named:
        return None
    listed = ", ".join(f"+trick={name} ({info['family']})" for name, info in named.items())
    return (f"control={cfg.control.name} trains without the GRPO loss, so {listed} would change nothing in it (a "
            f"control reads only the {' and '.join(CONTROL_READS)} families); drop the trick, or control=none")


def parses_answers(task: str) -> bool:
    """Whether a task parses a completion's final answer (`task.answer`): maj@k votes on them."""
    return hasattr(TASKS.get(task), "answer")


def check_eval_protocol(cfg: DictConfig) -> None:
    """The eval protocol's settings across keys (each key's own range: run_settings.py): greedy
    draws one answer, filters act only when sampling, pass@k and maj@k need k samples, maj@k a
    task that parses answers."""
    group = cfg.eval
    samples, temperature = group.samples, group.temperature
    if temperature == 0:
        _require(samples == 1, f"eval.samples={samples} with eval.temperature=0 draws the same greedy answer {samples} "
                               "times; set eval.temperature > 0 (e.g. eval=sampled) or eval.samples=1")
        moved = [f"eval.{key}={group[key]}" for key, off in (("top_p", 1.0), ("top_k", 0), ("min_p", 0.0))
                 if group[key] != off]
        _require(not moved, f"{' '.join(moved)} filters what is sampled, and eval.temperature=0 samples nothing "
                            "(greedy); set eval.temperature > 0 or drop it")
    for key in ("pass_k", "maj_k"):
        ks = group[key]
        if ks is None:
            continue
        bad = [k for k in ks if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= samples]
        _require(not bad, f"eval.{key}={list(ks)} is not allowed; each k must be an integer in 1..eval.samples "
                          f"({samples})")
    if group.maj_k and not parses_answers(cfg.task.name):
        raise ConfigError(f"eval.maj_k={list(group.maj_k)}: task={cfg.task.name} parses no answers to vote on; set "
                          "eval.maj_k=[]")
    EvalProtocol.from_group(group)   # every key readable as the protocol reads it


def check_model_and_task(cfg: DictConfig) -> None:
    """The model (path, dtype, device, LoRA), the rollout backend and the task's own options."""
    _require(not OmegaConf.is_missing(cfg.model, "path") or cfg.model.get("gguf_file"),
             f"model.path is required with model={cfg.model.name}: give a local directory "
             "with a saved transformers model, a .gguf file (or a hub name when online)")
    path = cfg.model.get("path")
    try:
        gguf = gguf_source(cfg.model)   # model.path=<file>.gguf, model.gguf_file: that file must exist
    except ModelPathError as err:
        raise ConfigError(str(err)) from None
    if gguf is None and path is not None and str(path).startswith(PACKAGE_PREFIX):
        try:
            local_path(path)
        except ModelPathError as err:
            raise ConfigError(str(err)) from None
    elif gguf is None and path is not None and looks_local(str(path)):
        _require(os.path.isdir(os.path.expanduser(str(path))),
                 f"model.path={path!r} does not exist; give a directory with a saved "
                 "transformers model (config.json), or leave it unset for the embedded tiny model")
    _check_model(cfg.model)
    problem = _fsdp_problem(cfg)
    _require(problem is None, f"model.fsdp=true {problem}")
    _check("task", cfg.task.name, choice(*sorted(TASKS)))
    _require(hasattr(TASKS[cfg.task.name], "warmup_batch") or cfg.model.get("path") is not None
             or cfg.model.get("gguf_file") is not None,
             f"task={cfg.task.name} needs a real model (the embedded one only knows arithmetic): "
             "model=hf model.path=<a model directory or hub name>")
    task_class = TASKS[cfg.task.name]
    settings = task_settings(task_class)
    unknown = [k for k in params(cfg.task) if k not in settings]
    _require(not unknown, f"task.{unknown[0] if unknown else ''} is not a setting of task={cfg.task.name}; "
                          f"allowed: {', '.join(settings)}")
    _check_task_builds(task_class, params(cfg.task))
    if is_multi_turn(task_class):   # sampling/multi_turn.py: what its episodes do not handle
        centering, env_mask = cfg.score_centering.name, cfg.env_mask.name
        _require(centering == "none" or env_mask == "masked",
                 f"score_centering={centering} cannot take env_mask={env_mask} on a multi-turn task "
                 f"(task={cfg.task.name}): the environment's tokens were not drawn by the sampler, so they have no "
                 "sampler head to centre on; use env_mask=masked")


# the tasks that built from these settings in this process, so that a sweep's plan checks each once, not once
# per variant: a generated task (those the embedded model knows) is made from its settings alone (~7 ms, its
# eval set drawn); a task of local files reads and checks its rows, keyed by the files as they are now
_BUILT: set = set()


def _files_now(settings: dict) -> tuple:
    """(path, size, mtime) of each local file a task's settings name: a file that changed is read again."""
    found = []
    for key in ("path", "eval_path"):
        value = settings.get(key)
        if isinstance(value, str) and os.path.isfile(os.path.expanduser(value)):
            stat = os.stat(os.path.expanduser(value))
            found.append((value, stat.st_size, stat.st_mtime_ns))
    return tuple(found)


def _check_task_builds(task_class, settings: dict) -> None:
    reads_files = getattr(task_class, "reads_local_files", False)
    key = (task_class, json.dumps(settings, sort_keys=True, default=repr), _files_now(settings) if reads_files else ())
    if key in _BUILT:
        return
    try:
        task = task_class(**settings)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err).splitlines()[0]) from None
    if reads_files:   # its rows read and checked now, before a run dir exists (a malformed row: ConfigError)
        task.load()
    if hasattr(task_class, "warmup_batch") or reads_files:   # a hub dataset is not read here: nothing to keep
        _BUILT.add(key)


LORA_KEYS = ("r", "alpha", "dropout", "target_modules")   # what peft's LoraConfig is made from (models.add_lora)


def _check_model(model: DictConfig) -> None:
    """The model's device beyond its declaration (run_settings.py): a pattern; LoRA whole or not at all."""
    device = str(model.get("device") or "cpu")
    _require(re.fullmatch(r"auto|cpu|cuda(:\d+)?", device) is not None,
             f"model.device={device!r} is not allowed; allowed: auto, cpu, cuda, cuda:N")
    lora = model.get("lora")
    if lora is not None and int(lora.get("r") or 0) > 0:
        missing = [f"model.lora.{key}" for key in LORA_KEYS if key not in lora]
        if missing:
            raise ConfigError(f"model.lora.r={lora.r} needs {', '.join(missing)} too (model=hf sets them all: "
                              f"alpha 32, dropout 0.0, target_modules all-linear); give them with +{missing[0]}=...")


def _fsdp_problem(cfg: DictConfig) -> str | None:
    """What model.fsdp=true (a sharded model, train/fsdp.py) cannot be combined with (None: all is well)."""
    if not setting(cfg, "model.fsdp"):
        return None
    if cfg.rollout.backend == "vllm":
        return ("does not work with rollout=vllm (its engine is loaded with the whole model in each process); "
                "use rollout=hf")
    if setting(cfg, "model.dtype") == "float16":
        return ("does not work with model.dtype=float16 (its loss scaler would see only this process's shard of "
                "the gradients); use model.dtype=bfloat16")
    if float(cfg.kl.get("beta_prev") or 0) > 0:
        return "does not work with kl=two_layer (its pi_prev weight snapshots are not sharded); use another kl"
    if cfg.diag.grad_conflict:
        return "does not work with diag.grad_conflict=true (it differentiates the unsharded weights); drop it"
    if cfg.control.name != "none":
        return f"does not work with control={cfg.control.name} (control runs train in one process)"
    if cfg.ref_sync.name != "none":
        return (f"does not work with ref_sync={cfg.ref_sync.name} (mixing and checkpointing a sharded reference "
                "is not implemented); use ref_sync=none")
    return None


def task_settings(task_class) -> list[str]:
    """The settings a task's constructor takes, with those its `**options` pass on to a base class
    (task=jsonl takes path and eval_path, and DatasetTask's eval_size, prompt_template, ...)."""
    settings = []
    for klass in task_class.__mro__:
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(klass.__init__).parameters.values()
        settings += [p.name for p in parameters if p.name != "self" and p.name not in settings
                     and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
    return settings
