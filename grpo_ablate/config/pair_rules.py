"""Combinations of settings that change what a trick means: one warning line each, before anything runs.

The inert rules (inert.py) say when one option cannot act. These say when two choices that each
act together make a run compare something else than its settings suggest. A rule is its name,
the combination it looks for in a composed config (in words, or None where it does not hold),
why that changes the comparison, what to do, and the anchor where it was found. Each reads the
registry's capability flags, never an option's name.

`grpo-ablate train` warns with every rule that holds; a sweep's plan (and --dry-run) and
`grpo-ablate doctor --lint FILE` say each rule once for the variants where it holds; the report
says it in its notes, from the runs' configs. A sweep file that asks about such a pair names the
rule under `expected_pairs:`, which silences it for that sweep. Rules and sources: docs/design.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from grpo_ablate.config.run_settings import setting
from grpo_ablate.config.validate import trick_families
from grpo_ablate.tricks import UnknownOption, option
from grpo_ablate.tricks.conditions import FILTERS_OFF, one_optimizer_step, sampler_truncates, truncation_unreplayed


@dataclass(frozen=True)
class PairRule:
    name: str
    # (cfg, the registry's entries of its chosen options) -> what is combined, in words; None: the rule does not hold
    combination: Callable[[Any, list], str | None]
    why: str
    fix: str
    source: str

    def line(self, combination: str) -> str:
        return f"{combination} {self.why}; {self.fix} (pair rule {self.name}; {self.source})"


def chosen_options(cfg) -> list:
    """The registry's entries of the options the config chose, family by family (an option an older
    run's config names that is no longer registered is left out)."""
    found = []
    for family in trick_families():
        if family in cfg:
            try:
                found.append(option(family, cfg[family].name))
            except UnknownOption:
                continue
    return found


def _named(options) -> str:
    return ", ".join(f"{o.family}={o.name}" for o in options)


def _sequence_ratio_by_length(cfg, options: list) -> str | None:
    ratio, weights = [o for o in options if o.sequence_ratio], [o for o in options if o.weights_by_length]
    if not ratio or not weights:
        return None
    return f"{_named(ratio)} (one importance ratio per sequence) with {_named(weights)}"


def _stale_steps_uncorrected(cfg, options: list) -> str | None:
    stale = [o for o in options if o.stale]
    if one_optimizer_step(cfg) or not stale or any(o.needs_sampler_logprobs for o in options):
        return None
    updates = cfg.updates
    steps = int(updates.mini_batches) * int(updates.epochs)
    return (f"{steps} optimizer steps per rollout (updates.mini_batches={updates.mini_batches}, updates.epochs="
            f"{updates.epochs}) on stale rollouts ({_named(stale)}) with no option reading the sampler's log-probs")


def _filters(cfg) -> str:
    return " ".join(f"rollout.{key}={cfg.rollout[key]}" for key, off in FILTERS_OFF.items()
                    if cfg.rollout.get(key, off) != off)


def _truncation_unreplayed_under_correction(cfg, options: list) -> str | None:
    readers = [o for o in options if o.needs_sampler_logprobs]
    if not readers or not truncation_unreplayed(cfg):
        return None
    return f"{_filters(cfg)} with rollout.sampling_replay=false under {_named(readers)}"


def _replay_off_without_truncation(cfg, options: list) -> str | None:
    if bool(setting(cfg, "rollout.sampling_replay")) or sampler_truncates(cfg):
        return None
    return "rollout.sampling_replay=false on a sampler that truncates nothing (top_k=0, top_p=1, min_p=0)"


PAIR_RULES = (
    PairRule("sequence_ratio_by_length", _sequence_ratio_by_length,
             "weights each sequence's loss by its length, where the sequence-level objective counts each "
             "sequence once", "use loss_agg=seq_mean_token_mean (TRL's grpo, verl's seq-mean-token-mean)",
             "TRL d98aef36e, PR #6042"),
    PairRule("stale_steps_uncorrected", _stale_steps_uncorrected,
             "stacks each rollout's later steps' drift on its staleness with nothing to weigh either",
             "add a rollout_correction (e.g. token_truncate) or take one optimizer step per rollout (updates=single)",
             "miles #1697, PR #2524"),
    PairRule("truncation_unreplayed", _truncation_unreplayed_under_correction,
             "compares the sampler's log-probs (renormalised over its kept tokens) with the trainer's (over the "
             "whole vocabulary): every importance weight carries the kept mass", "set rollout.sampling_replay=true",
             "TRL #6789, PR #7269; slime 8f5e21519, #2102"),
    PairRule("replay_without_truncation", _replay_off_without_truncation,
             "changes nothing: with no sampling filter the kept set is the whole vocabulary, so a contrast on the "
             "replay is between identical runs", "set rollout.top_p (or top_k, min_p) to ablate the replay",
             "slime #2102: the replay renormalises over a kept set"),
)
RULE_NAMES = tuple(rule.name for rule in PAIR_RULES)


def holding(cfg, expected=()) -> list[tuple[PairRule, str]]:
    """(rule, the combination in words) for every rule that holds in `cfg` and is not `expected`.
    A no-RL control run (control=base|sft|rft) has no loss for a pair to change; a config without the
    rollout or updates groups, or a key a rule reads (an older run's), is not read by that rule."""
    control = cfg.get("control")
    if (control is not None and control.get("name", "none") != "none") or "rollout" not in cfg or "updates" not in cfg:
        return []
    try:   # read once (~4 ms a config; three rules read them); an older config's unreadable ones: none
        options = chosen_options(cfg)
    except (AttributeError, KeyError):
        options = []
    found = []
    for rule in PAIR_RULES:
        if rule.name in expected:
            continue
        try:
            combination = rule.combination(cfg, options)
        except (AttributeError, KeyError):   # omegaconf's missing key: a config older than the rule
            continue
        if combination is not None:
            found.append((rule, combination))
    return found


def run_lines(cfg, expected=()) -> list[str]:
    """`train`'s warnings: one for each rule that holds."""
    return [rule.line(combination) for rule, combination in holding(cfg, expected)]


def variant_lines(configs: dict, expected=()) -> list[str]:
    """A sweep's warnings: configs is variant -> its config; one for each rule and combination,
    naming the variants where it holds."""
    where: dict = {}
    for variant, cfg in configs.items():
        for rule, combination in holding(cfg, expected):
            where.setdefault((rule, combination), []).append(variant)
    return [f"{_variants(names)}: {rule.line(combination)}" for (rule, combination), names in where.items()]


def _variants(names: list[str]) -> str:
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return f"variant{'s' if len(names) > 1 else ''} {shown}"


def unknown_expected(names) -> str | None:
    """A sweep file's `expected_pairs` that names no rule, as the one line that says so."""
    unknown = [n for n in names if n not in RULE_NAMES]
    return (f"expected_pairs: {', '.join(unknown)} is not a pair rule; allowed: {', '.join(RULE_NAMES)}"
            if unknown else None)
