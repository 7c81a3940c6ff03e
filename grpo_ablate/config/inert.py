"""When a trick cannot act: the options' own rules, read wherever a run or a plan is about to waste compute.

Each option's rules (`registry.Inert`: a condition of the composed config under which it
changes nothing, why, and what makes it act) are given where it is registered, in
grpo_ablate/tricks/. `grpo-ablate train` prints one warning line per inert trick among those
the run will actually use (its named tricks and every family whose option differs from the
defaults, however it got there: the command line, a named trick or a preset); `sweep` and
`doctor` refuse a plan in which a trick under test is inert (unless --allow-inert);
`grpo-ablate tricks` shows each trick's requirement. What a config cannot tell (an adaptive
controller whose target the task never reaches, a filter that never fires) the report finds
afterwards from the option's activity metric (registry.Activity; report/activity.py).
"""
from __future__ import annotations

from omegaconf import DictConfig

from grpo_ablate.config.compose import default_options
from grpo_ablate.config.validate import trick_families
from grpo_ablate.tricks import option


def rules(family: str, name: str) -> tuple:
    """The option's Inert rules (none for an unknown option)."""
    try:
        return option(family, name).inert
    except LookupError:
        return ()


def inert_reason(cfg: DictConfig, family: str, name: str) -> str | None:
    """Why option `name` of `family` cannot act in this config, with the fix; None if it can."""
    for rule in rules(family, name):
        if rule.when(cfg):
            return f"{rule.why}: {rule.fix}"
    return None


def requirement(family: str, name: str) -> str:
    """What the option needs to act ('' when nothing beyond itself)."""
    return "; ".join(rule.requires for rule in rules(family, name))


def inert_tricks(cfg: DictConfig, tricks: dict) -> list[tuple[str, str]]:
    """(trick, reason) for every named trick in `tricks` (name -> {family, option}) that cannot
    act in `cfg`, in their order."""
    out = []
    for name, info in tricks.items():
        reason = inert_reason(cfg, info["family"], info["option"])
        if reason is not None:
            out.append((name, reason))
    return out


def chosen_tricks(cfg: DictConfig, overrides=()) -> dict:
    """What the run will do beyond the defaults, as name -> {family, option}: its named tricks
    (+trick=...), then every family whose option in the composed config is not the default one
    (from the command line, a preset, anything), named `family=option`, and the family options
    given explicitly on the command line (clip=symmetric)."""
    chosen = {name: dict(info) for name, info in (cfg.get("tricks") or {}).items()}
    named = {info["family"] for info in chosen.values()}
    defaults = default_options()
    explicit = {key for key, _, value in (o.lstrip("+").partition("=") for o in overrides) if value}
    for family in trick_families():
        value = cfg[family].name
        if family not in named and (value != defaults.get(family) or family in explicit):
            chosen.setdefault(f"{family}={value}", {"family": family, "option": value})
    return chosen
