"""Paths a user names for run and sweep dirs: confined below their root, quoted for Hydra, writable."""
from __future__ import annotations

import os
from pathlib import Path

from grpo_ablate.errors import ConfigError

# ------------------------------------------------------------------------------ where a command writes
NAME_MAX = 255   # bytes in one path component on the usual file systems (ext4, xfs, btrfs, apfs)


def confined_dir(path, what: str, root: Path | None = None) -> Path:
    """`path` as a dir a command may create and write, or ConfigError in one line. Resolved first
    (`..`, symlinks, `~`), then refused when it is empty, has a name longer than a file system
    allows, or, inside `root` (a sweep's runs in its sweep dir), is not strictly under it; without
    a root, when it is the working directory or one above it: a run or sweep dir there would mix
    the tool's files (and a later rerun's set-aside) with the user's own."""
    text = "" if path is None else str(path)
    if not text.strip():
        raise ConfigError(f"{what} is empty; give the path of a new directory")
    resolved = Path(os.path.abspath(os.path.expanduser(text))).resolve()
    too_long = [part for part in Path(text).parts + resolved.parts if len(os.fsencode(part)) > NAME_MAX]
    if too_long:
        raise ConfigError(f"{what} {_shortened(text)}: the name {_shortened(too_long[0])} is "
                          f"{len(os.fsencode(too_long[0]))} bytes, longer than the {NAME_MAX} a file system allows; "
                          "give a shorter one")
    if root is not None:
        inside = Path(os.path.abspath(os.path.expanduser(str(root)))).resolve()
        if inside not in resolved.parents:
            raise ConfigError(f"{what} {text} is outside {root}; it must be a directory inside it")
        return Path(text)
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        where = "the working directory" if resolved == cwd else f"above the working directory {cwd}"
        raise ConfigError(f"{what} {text} is {where}; give a new directory inside it (e.g. runs/my-run) "
                          "or elsewhere")
    return Path(text)


def hydra_quoted(path) -> str:
    """A path as a Hydra override value: absolute and quoted, so that any character is allowed
    (Hydra's grammar takes only ASCII unquoted: `hydra.run.dir=rün` is a lexer error)."""
    return "'" + str(Path(path).resolve()).replace("\\", "\\\\").replace("'", "\\'") + "'"


def hydra_unquoted(value: str) -> str:
    """An override's value as the path it names: Hydra's quotes (`'a b'`, `"a b"`) taken off."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1].replace("\\" + value[0], value[0])
    return value


def _shortened(text: str, keep: int = 40) -> str:
    """A name as a message quotes it: a 300-character one would be the whole line."""
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"


def writable_problem(path: Path) -> str | None:
    """Why a directory cannot be made or written at `path` (None: it can): the first part of the
    path that exists is a file, or is not writable (a read-only file system, permissions)."""
    probe = Path(os.path.abspath(os.path.expanduser(str(path))))
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file, not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


def cache_message(cache_root: Path, problem: str) -> str:
    """The embedded model's cache cannot be written: where, why, and the setting that moves it."""
    return (f"cannot write the model cache {cache_root}: {problem}; set GRPO_ABLATE_CACHE (or model.cache_dir) to a "
            "writable directory")
