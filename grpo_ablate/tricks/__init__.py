"""The trick catalogue: pure tensor functions registered by name, one module per family (a package
split by kind where one module would not read on a few screens: clip/, adv/).

This package imports only torch. Each family module declares its family and registers its
options in `registry.py` (`register(family, option, knobs=..., activity=..., inert=...,
tricks=...)`): the implementation and every fact about it (knob ranges, the metric that
shows it acted, when it cannot act, the named tricks with their catalogue text). The trainer
asks the registry for the option its config chose (`option("adv", cfg.adv.name)`) and never
branches on a name itself; config checks, inert warnings, the report's activity table, the
catalogue, docs/tricks.md and docs/config.md's option table are all read from the registry
(grpo_ablate/config/catalogue.py). Adding an option is one registered function (`make catalogue` writes
its `conf/<family>/<option>.yaml` and `conf/trick/<name>.yaml`); adding a family is a module with
`declare_family(...)` and its call site in the loss or reward chain.
"""
import importlib
import pkgutil

from grpo_ablate.tricks.registry import Option, UnknownOption, declared_families, families, option, options

# every module of the package, imported for its declarations and registrations
FAMILY_MODULES = tuple(importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)
                       if m.name not in ("registry", "conditions", "behaviour"))
# Every family in the order a step meets them (declare_family's stage): docs/config.md's table and
# conf/config.yaml's defaults list follow it.
FAMILIES = tuple(family.name for family in declared_families())
__all__ = ["FAMILIES", "FAMILY_MODULES", "Option", "UnknownOption", "families", "option", "options"]
