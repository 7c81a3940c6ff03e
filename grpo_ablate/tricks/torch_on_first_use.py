"""`torch`, imported on first use: what lets the CLI check a config without paying for torch.

Every trick module is imported to check a config (its knobs, ranges and inert rules are
registered beside its function), but none needs torch until one of its functions runs.
Importing torch costs ~2 s on a 2-core machine, which is most of the time a refused command
took. So the trick modules write `from grpo_ablate.tricks.torch_on_first_use import torch`
and use it as the module itself: the first attribute read (`torch.where`) imports torch and
copies its names here, so every later read is an ordinary module attribute, no slower than
with `import torch`. tests/test_architecture.py checks that a refusal never imports torch.
"""
from __future__ import annotations

import importlib
import types


class _OnFirstUse(types.ModuleType):
    def __getattr__(self, attr: str):       # only called for a name not copied here yet
        real = importlib.import_module(self.__name__)
        self.__dict__.update(vars(real))    # later reads are plain module attribute reads
        return getattr(real, attr)          # (a submodule imported later: read from torch itself)


torch = _OnFirstUse("torch")
