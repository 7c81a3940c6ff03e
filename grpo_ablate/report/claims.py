"""The papers' claims beside a report's measurements: what a seed document says of a named trick
(registry.Claim) against what the sweep measured of it. A claim about the level is judged by the
contrast's verdict; one about the ceiling by the compute-performance fits' ceiling verdict
(report/scaling.py). In a sweep across contexts the level claims are judged per context
(report/transfer.py); in one context, here.
"""
from __future__ import annotations

from dataclasses import asdict

from grpo_ablate.report.load import Sweep, nested_value
from grpo_ablate.report.scaling import LOWERS, RAISES, SAME_CEILING
from grpo_ablate.report.verdicts import BREAKS_TRAINING, HELPS, HURTS, INERT, NO_EFFECT
from grpo_ablate.tricks.registry import all_options, option

AGREES, CONTRADICTS, UNDECIDED_HERE, NOT_TESTED = "agrees", "contradicts", "undecided here", "not tested here"
SAMPLED = ("pass@k", "avg@k")   # measures about a sampled eval's metrics (Claim.MEASURES)
# claim effect -> (measured verdicts that agree, measured verdicts that contradict), per measure
CLAIM_RULES = {
    "level": {
        "helps": ({HELPS}, {HURTS, BREAKS_TRAINING, NO_EFFECT}),
        "hurts": ({HURTS, BREAKS_TRAINING}, {HELPS, NO_EFFECT}),
        "does not help": ({HURTS, BREAKS_TRAINING, NO_EFFECT}, {HELPS}),
        "does not hurt": ({HELPS, NO_EFFECT}, {HURTS, BREAKS_TRAINING}),
        "no effect": ({NO_EFFECT}, {HELPS, HURTS, BREAKS_TRAINING}),
    },
    # the fits' ceiling verdict: ΔA's interval above (below) zero and |ΔA| past the tolerance, or
    # inside ±tolerance (same ceiling); anything else decides nothing
    # a sampled eval's metrics: the trick's verdict on it (pass@k: report/boundary.py's per-trick family)
    "pass@k": None, "avg@k": None,
    "ceiling": {
        "helps": ({RAISES}, {LOWERS, SAME_CEILING}),
        "hurts": ({LOWERS}, {RAISES, SAME_CEILING}),
        "does not help": ({LOWERS, SAME_CEILING}, {RAISES}),
        "does not hurt": ({RAISES, SAME_CEILING}, {LOWERS}),
        "no effect": ({SAME_CEILING}, {RAISES, LOWERS}),
    },
}


def judge(effect: str, verdict: str | None, measure: str = "level") -> str:
    """What one measured verdict (a contrast's, or its fits' ceiling verdict) says of one claimed effect."""
    if verdict == INERT:
        return NOT_TESTED      # the trick could not act here: nothing was measured
    agree, contradict = (CLAIM_RULES[measure] or CLAIM_RULES["level"])[effect]
    return AGREES if verdict in agree else CONTRADICTS if verdict in contradict else UNDECIDED_HERE


def registered_claims() -> dict[str, list[dict]]:
    """Named trick -> what the seed documents claim about it (registry.Claim: effect, where, source, says,
    measure), read from the registry (grpo_ablate/tricks/, which imports no torch)."""
    return {t.name: [asdict(c) for c in t.claims] for o in all_options() for t in o.tricks if t.claims}


def context_tags(config: dict | None) -> dict:
    """The papers' axes of a run's config: model (base | aligned, `model.stage`), data (the
    task's level), reward (0/1 or -1/1, `reward.wrong`)."""
    tags = {}
    stage = nested_value(config, "model", "stage")
    if stage:
        tags["model"] = str(stage)
    level = nested_value(config, "task", "level")
    if level:
        tags["data"] = str(level)
    wrong = nested_value(config, "reward", "wrong")
    if wrong is not None:
        tags["reward"] = f"{float(wrong):g}/{float(nested_value(config, 'reward', 'correct') or 1.0):g}"
    return tags


def claim_matches(where: str, tags: dict) -> bool:
    """A claim made in `where` ("model=aligned,data=easy"; empty: in general) is tested by a
    context with these tags."""
    pairs = [part.strip().split("=", 1) for part in where.split(",") if part.strip()]
    return all(tags.get(axis) == value for axis, value in pairs)


def named_trick(contrast: str, with_: str, without: str, sweep: Sweep) -> str | None:
    """The named trick a contrast measures: its own name; else the one trick its `with` side's runs
    have on and its `without` side's do not; else, where the two sides' configs differ in one trick
    family only, the named trick of the `with` side's option there (a variants file sets families
    freely: `clip=gpg` against the default clip measures `gpg_loss`)."""
    claims = registered_claims()
    if contrast in claims:
        return contrast
    config = lambda variant: next((r.config for r in sweep.runs if r.variant == variant and r.config), None)
    on = lambda variant: {name for r in sweep.runs if r.variant == variant
                          for name in (nested_value(r.config, "tricks") or {})}
    extra = on(with_) - on(without)
    if len(extra) == 1:
        return next(iter(extra))
    a, b = config(with_), config(without)
    if a is None or b is None:
        return None
    families = {o.family for o in all_options()}
    moved = [f for f in sorted(families) if nested_value(a, f, "name") != nested_value(b, f, "name")]
    if len(moved) != 1:
        return None
    try:
        tricks = option(moved[0], str(nested_value(a, moved[0], "name"))).tricks
    except LookupError:      # an option registered since the run, or a hand-written config
        return None
    return tricks[0].name if len(tricks) == 1 else None


def claims_section(sweep: Sweep, verdicts: list[dict], fits: dict,
                   sampled: dict | None = None) -> list[dict] | None:
    """A sweep in one context: per claim of each named trick a contrast measured, the verdict it is
    judged by and the judgement. None across contexts (report/transfer.py judges those) or when no
    contrast measured a trick with a claim. `sampled`: what the report's eval measured, for the claims
    about a sampled eval's metrics: {"avg@k" / "pass@k": trick -> its verdict on avg@n / pass@n of the
    final eval of n >= 2 samples (report/boundary.py, or the report's own verdicts where they are those),
    "k": n, "why": why neither was measured}."""
    if sweep.contexts or not verdicts:
        return None
    sampled = sampled or {}
    registered = registered_claims()
    fitted = {c["trick"]: c for c in fits.get("contrasts", [])}
    config = next((r.config for r in sweep.runs if r.config), None)
    tags = context_tags(config)
    rows = []
    for v in verdicts:
        trick = named_trick(v["trick"], v["with"], v["without"], sweep)
        for claim in registered.get(trick, []):
            measured, shown = measured_for(claim["measure"], v, fitted, sampled)
            unmeasured = claim["measure"] in SAMPLED and measured is None   # the eval could not measure it
            judged = NOT_TESTED if unmeasured or not claim_matches(claim["where"], tags) else \
                judge(claim["effect"], measured, claim["measure"])
            rows.append({"contrast": v["trick"], "trick": trick, **claim, "measured": shown, "judged": judged})
    return rows or None


def measured_for(measure: str, verdict: dict, fitted: dict, sampled: dict) -> tuple[str | None, str | None]:
    """(the verdict a claim about `measure` is judged by, what the table shows for it)."""
    if measure == "level":
        return verdict["verdict"], verdict["verdict"]
    if measure == "ceiling":   # the fits' ceiling verdict; without one, their split says why (poor fits, drifts)
        split = fitted.get(verdict["trick"], {})
        return split.get("ceiling"), split.get("ceiling") or split.get("split")
    found = (sampled.get(measure) or {}).get(verdict["trick"])
    return (found, f"{found} ({measure[:-1]}{sampled['k']})") if found is not None else \
        (None, sampled.get("why") or "not measured: the eval drew one sample per problem")
