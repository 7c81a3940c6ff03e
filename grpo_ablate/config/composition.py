"""Hydra's composition of this package's conf, done from YAML files read once per process.

Hydra rebuilds everything on each composition (~45 files parsed, a defaults tree, an interpolation
map per file, its own `hydra` node composed and then dropped): 0.2-1.5 s, so a dry run's sweep of
20 variants spent most of its time there. The conf uses a small part of the defaults-list grammar
(group choices, `_self_`, a sibling config of the same group, `override /group: option` in
`# @package _global_` files, `+group=[a, b]`); `compose` follows Hydra's rules for that part (the
defaults walked last to first, the first override of a group winning, a file's content where its
`_self_` is) and returns None for anything else, and for every input Hydra would refuse, so the
caller asks Hydra, which composes it or raises its own error. Overrides are parsed and applied
by Hydra's own code, except the plain ones (`key=word`, `key=-12`, `key=[a,b]` changing a value
already there), read and set here as Hydra would. tests/test_composition.py compares the two on
every option, and each shortcut with what it stands in for. Costs: docs/performance.md.
"""
from __future__ import annotations

import copy
import functools
import os
import pickle
import re
from importlib import resources

from omegaconf import DictConfig, OmegaConf

SELF = "_self_"
MISSING = "???"


# The releases whose private APIs this follows (ConfigLoaderImpl._apply_overrides_to_config, ConfigSource.
# _get_header_dict, omegaconf._utils.get_yaml_loader, Override's fields): under any other, Hydra composes.
SUPPORTED = {"hydra-core": "1.3", "omegaconf": "2.3"}


def _supported() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return all(version(package).split(".")[:2] == release.split(".") for package, release in SUPPORTED.items())
    except PackageNotFoundError:
        return False


FOLLOWED = _supported()   # checked once, at import


class Unsupported(Exception):
    """Outside the part of Hydra's grammar followed here, or an input Hydra refuses: ask Hydra."""


def compose(module: str, name: str, overrides: list[str]) -> DictConfig | None:
    """The config Hydra's `compose(name, overrides)` returns for the conf in `module`, or None: under
    releases not SUPPORTED, outside the grammar followed, and for an input Hydra or OmegaConf refuses (so
    that their error is the one the user sees). Any other exception is a fault here, and is raised."""
    import yaml
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if not FOLLOWED:
        return None
    try:
        return _compose(str(resources.files(module)), name, overrides)
    except (Unsupported, HydraException, OmegaConfBaseException, yaml.YAMLError):
        return None


def _compose(root: str, name: str, overrides: list[str]) -> DictConfig:
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.config_store import ConfigStore

    # a config node registered in Python (not a YAML file) would be merged, or matched as a schema, by Hydra
    if set(ConfigStore.instance().repo) - {"hydra", "_dummy_empty_config_.yaml"}:   # the second: Hydra's own
        raise Unsupported("ConfigStore nodes")
    choices, appended, values = _split(root, overrides)
    walk = _Walk(root, choices)
    items = walk.node(name, "", appended=appended)
    if any(not used for used in walk.used.values()):
        raise Unsupported("an override of a group not in the defaults list")
    merged: dict = {}
    for content, package in items:
        _merge(merged, _embed(content, package))
    merged.pop("hydra", None)
    rest = _set_plain_values(merged, values)
    cfg = _config(merged)
    OmegaConf.set_struct(cfg, True)
    ConfigLoaderImpl._apply_overrides_to_config(rest, cfg)
    return cfg


def _set_plain_values(merged: dict, overrides: list) -> list:
    """Set on the merged data the leading overrides that change a value already there (not a mapping)
    to a plain one or a list of them, as Hydra's OmegaConf.update sets them (~0.3 ms each on the config); the
    rest, in their order, are Hydra's to apply."""
    from hydra.core.override_parser.types import OverrideType

    plain = (str, int, float, bool, type(None))
    for done, override in enumerate(overrides):
        value = override.value()
        if override.type is not OverrideType.CHANGE or not (
                type(value) in plain or type(value) is list and all(type(v) in plain for v in value)):
            return overrides[done:]
        *parents, leaf = override.key_or_group.split(".")
        node = merged
        for parent in parents:
            node = node.get(parent) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node or isinstance(node[leaf], dict):
            return overrides[done:]
        node[leaf] = value   # a list replaces a list: OmegaConf merges lists by replacing them
    return []


# a config built before (pickled) with its plain values, by its top-level keys: most of a sweep's
# compositions differ from another in a few families, and building every node again
# (OmegaConf.create, ~25 ms) was half a composition's cost; a pickled one loads in ~2 ms
_BUILT: dict[tuple, tuple[bytes, dict, dict]] = {}


def _config(merged: dict) -> DictConfig:
    """OmegaConf.create(merged), node for node: the last config built with the same top-level keys,
    its top-level values that differ set afresh (a container only where both are mappings)."""
    held = _BUILT.get(tuple(merged))
    if held is not None:
        blob, plain, shown = held
        changed = [key for key, value in merged.items() if repr(value) != shown[key]]   # 1, 1.0 and True differ
        if all(isinstance(merged[key], dict) == isinstance(plain[key], dict)
               and not isinstance(merged[key], list) and not isinstance(plain[key], list) for key in changed):
            cfg = pickle.loads(blob)
            for key in changed:
                cfg[key] = merged[key]
            return cfg
    cfg = OmegaConf.create(merged)
    _BUILT[tuple(merged)] = (pickle.dumps(cfg), copy.deepcopy(merged), {key: repr(v) for key, v in merged.items()})
    return cfg


def _split(root: str, overrides: list[str]) -> tuple[dict, list, list]:
    """Hydra's reading of the overrides: group choices, groups appended, and values to set."""
    choices, appended, values = {}, [], []
    for override in map(_parsed_override, overrides):
        key = override.key_or_group
        if override.is_sweep_override() or override.is_hydra_override() or override.package is not None:
            raise Unsupported(override.input_line)
        value = override.value()
        if isinstance(value, dict) or not os.path.isdir(os.path.join(root, *key.split("/"))):
            values.append(override)
        elif override.is_force_add() or override.is_delete() or not isinstance(value, (str, list)):
            raise Unsupported(override.input_line)
        elif override.is_add():
            appended.append((key, value))
        else:
            choices[key] = value
    return choices, appended, values


# `key=word`, `key=-12` and `key=[word,word]`, read as Hydra's grammar reads them: most of a sweep's
# overrides (a run's name, its variant and tags, a group's option, a seed) without its parser (~3 ms each)
_DOTTED_KEY = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", re.ASCII)
_WORD = re.compile(r"[A-Za-z_][\w@.-]*", re.ASCII)
_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)", re.ASCII)
_NOT_STRINGS = {"true", "false", "null", "inf", "nan"}   # words Hydra reads as values, in any case


def _plain_value(text: str):
    """The value Hydra's grammar gives `text` where it is a word, an integer or a list of words; else None."""
    if _WORD.fullmatch(text) and text.lower() not in _NOT_STRINGS:
        return text
    if _INTEGER.fullmatch(text):
        return int(text)
    if text.startswith("[") and text.endswith("]"):
        words = text[1:-1].split(",") if text != "[]" else []
        if all(_WORD.fullmatch(w) and w.lower() not in _NOT_STRINGS for w in words):
            return words
    return None


@functools.lru_cache(maxsize=4096)
def _parsed_override(text: str):
    """Hydra's parse of one override: a sweep's variants share most of theirs."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Override, OverrideType, ValueType

    key, equals, value = text.partition("=")
    plain = _plain_value(value) if equals and _DOTTED_KEY.fullmatch(key) else None
    if plain is not None:
        return Override(type=OverrideType.CHANGE, key_or_group=key, value_type=ValueType.ELEMENT, _value=plain,
                        input_line=text)
    return OverridesParser.create().parse_overrides(overrides=[text])[0]


class _Walk:
    """Hydra's defaults tree, walked as it walks it: a config's defaults last to first, a group's
    choice taken from the first override seen for it (the command line's, then the files')."""

    def __init__(self, root: str, choices: dict):
        self.root = root
        self.choices = dict(choices)
        self.used = {group: False for group in choices}
        self.known: dict[str, object] = {}

    def node(self, path: str, package: str, appended: list = ()) -> list[tuple[dict, str]]:
        """The (content, package) pairs config `path` contributes, in merge order."""
        header, content, defaults = _read(self.root, path)
        if header == "_global_":
            package = ""
        elif header is not None:
            raise Unsupported(f"{path}: @package {header}")
        entries = [_entry(d) for d in defaults] + [("group", group, value) for group, value in appended]
        self._register_overrides(path, entries)
        # without `_self_` a file's content comes last (after its defaults), or is the file itself
        if not any(kind == "self" for kind, *_ in entries):
            entries.append(("self", None, None))
        folder = os.path.dirname(path)
        if folder and any(kind == "group" for kind, *_ in entries):
            raise Unsupported(f"{path}: a group relative to {folder}")
        parts = []
        for kind, key, value in reversed(entries):
            if kind == "self":
                parts.append([(content, package)])
            elif kind == "config":
                parts.append(self.node(f"{folder}/{key}" if folder else key, package))
            elif kind == "group":
                parts.append(self._group(key, value, appended=(key, value) in appended))
        return [item for part in reversed(parts) for item in part]

    def _register_overrides(self, path: str, entries: list) -> None:
        seen = False
        for kind, key, value in entries:
            if kind == "override":
                seen = True
                if key not in self.choices:
                    self.choices[key], self.used[key] = value, False
            elif seen and kind != "self":
                raise Unsupported(f"{path}: an override before a default")   # Hydra refuses it

    def _group(self, group: str, value, appended: bool) -> list[tuple[dict, str]]:
        if not appended and group in self.choices:
            value, self.used[group] = self.choices[group], True
        if isinstance(value, list):
            if not appended:
                raise Unsupported(f"{group}: a list of options in the defaults")
            # Hydra walks the options last to first too (the last one's overrides win)
            parts = [self.node(f"{group}/{option}", group) for option in reversed(value)]
            return [item for part in reversed(parts) for item in part]
        if group in self.known or (appended and group in self.choices):
            raise Unsupported(f"{group} twice")   # Hydra: "Multiple values for ..." or appended over a default
        self.known[group] = value
        return [] if value is None else self.node(f"{group}/{value}", group)


def _entry(default) -> tuple[str, str | None, object]:
    """One defaults-list entry as (self | config | group | override, name or group, option)."""
    if default == SELF:
        return "self", None, None
    if isinstance(default, str):
        if "/" in default or "@" in default or default.startswith("${"):
            raise Unsupported(default)
        return "config", default, None
    if not isinstance(default, dict) or len(default) != 1:
        raise Unsupported(str(default))
    (key, value), = default.items()
    words = key.split()
    kind = "override" if words[0] == "override" and len(words) == 2 else "group" if len(words) == 1 else None
    group = words[-1]
    if kind is None or "@" in group or "${" in str(value) or (kind == "override") != group.startswith("/"):
        raise Unsupported(key)
    if group.lstrip("/").startswith("hydra") or not (value is None or isinstance(value, str)):
        raise Unsupported(key)
    return kind, group.lstrip("/"), value


def _read(root: str, path: str) -> tuple[str | None, dict, list]:
    """A conf file's @package header, its content and its defaults list (read once per file state)."""
    file = os.path.join(root, *path.split("/")) + ".yaml"
    if not os.path.isfile(file):
        raise Unsupported(f"no file {path}")   # Hydra names the options there are
    info = os.stat(file)
    return _parsed(file, info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=1024)
def _parsed(file: str, size: int, mtime_ns: int) -> tuple[str | None, dict, list]:
    import yaml
    from hydra.plugins.config_source import ConfigSource

    with open(file, encoding="utf-8") as handle:
        text = handle.read()
    header = ConfigSource._get_header_dict(text).get("package")
    content = yaml.load(text, Loader=_yaml_loader()) if text.strip() else {}
    if content is None:
        content = {}
    if not isinstance(content, dict):
        raise Unsupported(f"{file}: not a mapping")
    defaults = content.pop("defaults", [])
    if not isinstance(defaults, list):
        raise Unsupported(f"{file}: defaults")
    return header, content, defaults


@functools.cache
def _yaml_loader():
    """OmegaConf's reading of YAML (its float rule, no timestamps, a duplicate key refused) on libyaml's
    parser: ~0.2 ms a file where OmegaConf's pure-Python one takes ~2, without the nodes it would build."""
    import yaml
    from omegaconf._utils import get_yaml_loader

    omegaconf_loader = get_yaml_loader()
    parser = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # a PyYAML built without libyaml: the Python one

    class Loader(parser):
        yaml_implicit_resolvers = omegaconf_loader.yaml_implicit_resolvers
        yaml_constructors = omegaconf_loader.yaml_constructors

        def construct_mapping(self, node, deep=False):
            keys = [k.value for k, _ in node.value if k.tag == yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG]
            if len(keys) != len(set(keys)):
                raise Unsupported(f"a duplicate key at {node.start_mark}")   # Hydra names it
            return super().construct_mapping(node, deep=deep)

    return Loader


def _embed(content: dict, package: str) -> dict:
    for key in reversed(package.split(".") if package else []):
        content = {key: content}
    return content


def _merge(dest: dict, src: dict) -> None:
    """OmegaConf.merge's rules on plain YAML data: dicts merge key by key, anything else replaces,
    and a missing value (???) leaves a value already there."""
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dest.get(key), dict):
            _merge(dest[key], value)
        elif value == MISSING and key in dest:
            continue
        else:
            dest[key] = copy.deepcopy(value)
