"""Which declared trick families one real training run never looks up: a family without a call site.

The trainer reaches a family only through the run spec's bound options (`spec.tricks[family]`,
config/spec.py's bound_options); this wraps that mapping so every lookup by name is recorded, runs a real
`train` in this process, and lists the declared families (registry.declare_family) that nothing
looked up. Iterating over the mapping does not count as reading a family: a call site names it.

    python tests/family_reads.py '<overrides as JSON>' RUN_DIR   # prints the unread families as JSON

(tests/test_family_reads.py runs it in-process; tests/test_throwaway.py runs it on a copy of the
package, before and after the throwaway family's call site is added.)
"""
from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path


class Recording(Mapping):
    """The bound options, with every family looked up by name recorded."""

    def __init__(self, bound: Mapping, read: set):
        self._bound, self._read = bound, read

    def __getitem__(self, family):
        self._read.add(family)
        return self._bound[family]

    def __iter__(self):
        return iter(self._bound)

    def __len__(self):
        return len(self._bound)

    # Mapping's own values() and items() look every key up: asking all options at once (RunSpec.needs)
    # names no family, so it reads none
    def values(self):
        return self._bound.values()

    def items(self):
        return self._bound.items()


def unread_families(overrides: list[str], run_dir: Path) -> list[str]:
    from grpo_ablate.config import spec as spec_module
    from grpo_ablate.config.compose import compose
    from grpo_ablate.train.grpo import train
    from grpo_ablate.tricks.registry import declared_families

    read: set = set()
    real = spec_module.bound_options
    spec_module.bound_options = lambda cfg: Recording(real(cfg), read)
    try:
        train(compose(overrides), run_dir, overrides)
    finally:
        spec_module.bound_options = real
    return sorted({f.name for f in declared_families()} - read)


if __name__ == "__main__":
    print(json.dumps(unread_families(json.loads(sys.argv[1]), Path(sys.argv[2]))))
