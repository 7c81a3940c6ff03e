"""Compose a run's config as `grpo-ablate train` would, without a run dir: Hydra's errors become
one line naming what is allowed (ConfigError), and a `+key` that nothing reads is refused."""
from __future__ import annotations

import copy
import functools
import os
import re

from omegaconf import DictConfig, OmegaConf

from grpo_ablate.config import composition
from grpo_ablate.config.identity import later_keys
from grpo_ablate.config.validate import trick_families
from grpo_ablate.errors import ConfigError
from grpo_ablate.tricks import options
from grpo_ablate.tricks.registry import family_info

CONFIG_MODULE = "grpo_ablate.conf"
CONFIG_NAME = "config"


def default_options() -> dict[str, str]:
    """Each config group's option in conf/config.yaml's defaults list (what a run gets unless
    something, a preset, a named trick or the command line, picks another)."""
    from importlib import resources

    import yaml

    text = resources.files(CONFIG_MODULE).joinpath(f"{CONFIG_NAME}.yaml").read_text()
    return {key: value for entry in yaml.safe_load(text)["defaults"] if isinstance(entry, dict)
            for key, value in entry.items()}


def compose(overrides: list[str], shared: bool = False) -> DictConfig:
    """Compose the config the way `grpo-ablate train` would, without creating a run dir.

    Hydra's composition errors become one-line ConfigErrors naming what is allowed. `shared`: the
    process's one copy, read-only, for a caller that only reads it (a sweep's plan: a copy costs a
    third of a composition), else a copy of its own.
    """
    from hydra.errors import HydraException, MissingConfigException, OverrideParseException

    overrides = listed_since(overrides)
    removed = next((o for o in overrides if o.startswith("~")), None)
    if removed is not None:   # every key the config has is read by the run: without it, a traceback later
        key = removed[1:].split("=", 1)[0]
        raise ConfigError(f"{removed}: removing a setting is not allowed (the run reads every one); set it instead"
                          + (f": {key}=<option> ({', '.join(sorted(options(key)))})" if key in trick_families()
                             else f", e.g. {key}=<value>"))
    try:
        cfg = _hydra_compose(overrides, shared)
    except MissingConfigException as err:
        message = _missing_option_message(err)
    except OverrideParseException as err:
        bad = next((o for o in overrides if o in str(err)), None) or " ".join(overrides)
        message = f"could not parse the override '{bad}': {_first_line(str(err))}"
    except HydraException as err:
        text = str(err).strip() or str(err.__cause__ or err.__context__ or type(err).__name__)
        message = _composition_message(text, overrides)
    else:
        check_added_keys(overrides)
        return cfg
    raise ConfigError(message)


def listed_since(overrides: list[str]) -> list[str]:
    """`+key=value` for a key that came after runs existed (declared with a neutral value, allowed.py)
    as `++key=value`: such a key was once added with a `+` (a knob its config left out then:
    `+adv.lam_fn=vapo`), so a run recorded with it resumes, and the habit still works."""
    later = later_keys()
    return [f"+{o}" if o.startswith("+") and not o.startswith("++") and _key_of(o) in later else o
            for o in overrides]


# Keys the code reads (with a default) that not every config has, so `+key=value` may add them.
# A trick family's keys are checked against the registry and a task's against its constructor;
# any other key that a `+` adds would be read by nothing, and is refused.
ADDABLE_KEYS = ("model.dtype", "model.device", "model.lora", "model.gradient_checkpointing")


def check_added_keys(overrides: list[str]) -> None:
    """Refuse `+key=value` for a key that nothing reads (`+rollout.temperature=0` would be kept
    and ignored: the run would sample at temperature 1), naming the keys that exist nearby."""
    added = [o for o in overrides if o.startswith("+") and "=" in o and not _is_group(_key_of(o))]
    if not added:
        return
    families = set(trick_families()) | {"task"}
    base = None
    for override in added:
        key = _key_of(override)
        if key.split(".")[0] in families or key in ADDABLE_KEYS or key.startswith(
                tuple(k + "." for k in ADDABLE_KEYS)):
            continue
        if base is None:   # the config without the additions: what exists
            base = _hydra_compose([o for o in overrides if o not in added])
        if OmegaConf.select(base, key, default=_ABSENT) is not _ABSENT:
            continue       # `++key=value` on a key that exists: an ordinary override
        raise ConfigError(f"{override}: no setting {key} exists, and nothing would read it{_nearby(base, key)}")


_ABSENT = object()


def _key_of(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def _is_group(key: str) -> bool:
    """Whether `key` names a config group (`trick`, `preset`): `+group=option` adds a config."""
    from importlib import resources

    return resources.files(CONFIG_MODULE).joinpath(*key.split("/")).is_dir()


def _nearby(base: DictConfig, key: str) -> str:
    """'; did you mean X' and the keys that exist where `key` was meant to go."""
    import difflib

    parent, _, leaf = key.rpartition(".")
    hint = f"; {leaf} is a trick family: choose its option with {leaf}=<option>" if leaf in trick_families() else ""
    having = _options_with_setting(parent, leaf) if parent in trick_families() else []
    if having:   # `staleness.k=2` while staleness=none: the options that have k, not a near spelling
        return (f"; {leaf} is a setting of {parent}={'|'.join(having)}, not of {parent}={base[parent].name}: "
                f"choose one, e.g. {parent}={having[0]} {key}=...")
    close = difflib.get_close_matches(key, _leaf_keys(OmegaConf.to_container(base)), n=3, cutoff=0.75)
    if close:
        hint += f"; did you mean {' or '.join(close)}"
    node = OmegaConf.select(base, parent) if parent else base
    if isinstance(node, DictConfig):
        hint += f"; keys of {repr(parent) if parent else 'the top level'}: {', '.join(sorted(node.keys()))}"
    return hint


def _options_with_setting(family: str, setting: str) -> list[str]:
    """The options of a trick family that take `setting` (a knob of theirs, or a family setting their flags allow)."""
    flagged = family_info(family).settings.get(setting)
    return sorted(name for name, chosen in options(family).items()
                  if setting in chosen.ranges or flagged is not None and (flagged[1] is None
                                                                          or getattr(chosen, flagged[1])))


def _leaf_keys(node: dict, prefix: str = "") -> list[str]:
    """Every dotted key of a config (as a plain dict) that holds a value."""
    keys = []
    for k, child in node.items():
        keys += _leaf_keys(child, f"{prefix}{k}.") if isinstance(child, dict) else [f"{prefix}{k}"]
    return keys


def _hydra_compose(overrides: list[str], shared: bool = False) -> DictConfig:
    """The composition of `overrides`, once per process for each overrides and state of the conf
    files (a sweep's plan and its warm-start check, a refusal's base config). A copy goes out, since callers may
    change the config they get, unless `shared`: then the cached one, read-only so that no caller can."""
    cfg = _composed(tuple(overrides), _conf_state())
    if shared:
        OmegaConf.set_readonly(cfg, True)
        return cfg
    cfg = copy.deepcopy(cfg)
    OmegaConf.set_readonly(cfg, None)   # as composed: the cached one may have been shared (read-only) before
    return cfg


@functools.lru_cache(maxsize=256)
def _composed(overrides: tuple[str, ...], conf_state: tuple) -> DictConfig:
    # from the conf files read once per process (~10 ms); Hydra itself (0.2-1.5 s) for what that
    # does not follow, and for every input it refuses, so its error is the one the user sees
    return composition.compose(CONFIG_MODULE, CONFIG_NAME, list(overrides)) or _hydra_composed(overrides)


def _hydra_composed(overrides: tuple[str, ...]) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    # initialised and cleared around each composition (~1 ms): GlobalHydra is clear again for the
    # real run's @hydra.main (entrypoint.py), which initialises it itself
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        return hydra_compose(config_name=CONFIG_NAME, overrides=list(overrides))


def _conf_state() -> tuple:
    """Every conf file with its size and mtime (~1 ms): a file written since (a new option's YAML,
    `make catalogue`) composes afresh instead of from the cache."""
    from importlib import resources

    state = []
    for folder, _, names in os.walk(str(resources.files(CONFIG_MODULE)), followlinks=True):
        for name in names:
            if name.endswith(".yaml"):
                info = os.stat(os.path.join(folder, name))
                state.append((folder, name, info.st_size, info.st_mtime_ns))
    return tuple(sorted(state))


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text


def _missing_option_message(err) -> str:
    text = str(err)
    match = re.search(r"Could not find '([^']+)/([^']+)'", text)
    options = [o for o in (getattr(err, "options", None) or []) if o]
    if match:
        group, option = match.groups()
        allowed = ", ".join(sorted(options)) if options else "(see conf/" + group + "/)"
        return f"{group}={option} is not an option of config group '{group}'; allowed: {allowed}"
    return _first_line(text)


def _chosen_groups(overrides: list[str]) -> DictConfig:
    """The config the user chose options for: the overrides that pick a group's option (`family=option`,
    `preset=…`, `+trick=…`), not the settings; so that the keys a refusal lists are those of the option
    chosen (`rollout_correction=tv_filter rollout_correction.bound=1` lists tv_filter's, not none's)."""
    chosen = [o for o in overrides if "=" in o and "." not in o.split("=", 1)[0]]
    try:
        return _hydra_compose(chosen)
    except Exception:   # an unknown option among them: its own refusal comes first; list the default's keys
        return _hydra_compose([])


def _composition_message(text: str, overrides: list[str]) -> str:
    exists = re.search(r"Could not append to config\. An item is already at '([^']+)'", text)
    if exists:
        return f"{exists.group(1)} exists already; set it without the +: {exists.group(1)}=..."
    match = re.search(r"Could not override '([^']+)'", text)
    if match and "Key '" in text or (match and "No match in the defaults list" not in text):
        key = match.group(1)
        addable = key in ADDABLE_KEYS or key.startswith(tuple(k + "." for k in ADDABLE_KEYS))
        return (f"unknown config key '{key}'" + (f" (this config has none; add it with +{key}=...)" if addable else "")
                + _nearby(_chosen_groups(overrides), key))
    if match:
        return (f"'{match.group(1)}' is not a config group of the defaults list; "
                f"to add one use +{match.group(1)}=<option>")
    return text.strip().splitlines()[0] if text.strip() else "invalid overrides: " + " ".join(overrides)
