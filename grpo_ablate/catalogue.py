"""Everything the trick registry says, as the tables other places show: derived, never kept by hand.

    load_catalogue()   the named tricks (`grpo-ablate tricks`, docs/tricks.md): name, family,
                       option, what, source, verdict, cost, claims, requires, activity
    activity_table()   (family, option) -> (metric, kind, threshold): the report's *inert here*
                       (written to report/activity_table.py, which the report reads without torch)
    option_table()     the table of trick families and their options (docs/config.md)

`python -m grpo_ablate.catalogue --write` (`make catalogue`) rewrites docs/tricks.md, the
family table of docs/config.md, report/activity_table.py and report/claims_table.py from the
registry; tests/test_catalogue.py fails while any of them is stale.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from grpo_ablate.config import default_options
from grpo_ablate.inert import requirement
from grpo_ablate.tricks import FAMILIES
from grpo_ablate.tricks.registry import all_options, family_info, options

COLUMNS = ("name", "family", "option", "what", "source", "verdict", "cost")
REPO = Path(__file__).resolve().parents[1]
ACTIVITY_MODULE = Path(__file__).resolve().parent / "report" / "activity_table.py"
CLAIMS_MODULE = Path(__file__).resolve().parent / "report" / "claims_table.py"
OPTIONS_PAGE = REPO / "docs" / "config.md"   # the page whose family table is generated
TABLE_BEGIN = "<!-- trick families: generated from the registry by `make catalogue`; do not edit by hand -->"
TABLE_END = "<!-- end of the generated trick families -->"


def load_catalogue() -> list[dict]:
    """One row per named trick, by name: the facts registered with the option it selects."""
    rows = []
    for opt in all_options():
        for t in opt.tricks:
            rows.append({"name": t.name, "family": opt.family, "option": opt.name, "what": t.what,
                         "source": t.source, "verdict": t.verdict, "cost": t.cost,
                         "claims": [claim_row(c) for c in t.claims],
                         "requires": requirement(opt.family, opt.name) or "-",   # when it can act at all
                         "activity": describe_activity(opt.activity)})
    return sorted(rows, key=lambda r: r["name"])


def claim_row(claim) -> dict:
    return {"effect": claim.effect, "where": claim.where, "source": claim.source, "says": claim.says}


def describe_activity(activity) -> str:
    if activity is None:
        return "-"
    if activity.kind == "above":
        return f"{activity.metric} > {activity.threshold:g}"
    return f"{activity.metric} ≠ 0" if activity.kind == "nonzero" else f"{activity.metric} changes"


def activity_table() -> dict:
    """(family, option) -> (metric, kind, threshold) for every option with an activity metric."""
    return {(o.family, o.name): (o.activity.metric, o.activity.kind, o.activity.threshold)
            for o in all_options() if o.activity is not None}


def render(rows: list[dict], fmt: str) -> str:
    """`json` or `md` text (the `table` form is drawn by the CLI with rich)."""
    if fmt == "json":
        return json.dumps(rows, indent=2)
    head = ("| trick | family=option | what it changes | source | seed review | extra compute | acts only with "
            "| shows it acted |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['name']}` | `{r['family']}={r['option']}` | {r['what']} | {r['source']} | "
                     f"{r['verdict'].replace('_', ' ')} | {r['cost']} | {r['requires']} | {r['activity']} |")
    claimed = [r for r in rows if r["claims"]]
    if claimed:
        lines += ["", "## What the seed documents claim", "",
                  "A sweep across contexts sets its measurements beside these (the report's *Claims* section: "
                  "agrees, contradicts, undecided here, not tested here). *where*: the context the claim was made "
                  "in (model base|aligned, data easy|medium|hard, reward 0/1|-1/1); blank: in general.", "",
                  "| trick | claim | where | source |", "|---|---|---|---|"]
        lines += [f"| `{r['name']}` | *{c['effect']}*: {c['says']} | {c['where'] or '-'} | {c['source']} |"
                  for r in claimed for c in r["claims"]]
    return "\n".join(lines)


def option_table() -> str:
    """The table of the trick families (docs/config.md): each family's options (the default first, then in
    registration order), its summary and the module that implements it."""
    lines, defaults = ["| trick family | options now | what it sets |", "|---|---|---|"], default_options()
    for family in FAMILIES:
        info = family_info(family)
        ordered = sorted(options(family), key=lambda name: name != defaults.get(family))   # the default first
        names = ", ".join(f"`{name}`" for name in ordered)
        module = info.module.replace(".", "/") + ".py"
        lines.append(f"| `{family}` | {names} | {info.summary} (`{module.removeprefix('grpo_ablate/')}`) |")
    return "\n".join(lines)


def activity_module() -> str:
    """The text of report/activity_table.py."""
    entries = "\n".join(f"    {key!r}: {value!r}," for key, value in sorted(activity_table().items()))
    return ('"""The activity metric of every option, generated from the trick registry by `make catalogue`:\n'
            "do not edit (tests/test_catalogue.py fails while it differs from the registry). The report\n"
            'reads it without importing torch. (family, option) -> (metric, kind, threshold)."""\n'
            f"ACTIVITY = {{\n{entries}\n}}\n")


def claims_module() -> str:
    """The text of report/claims_table.py."""
    import pprint

    claims = {r["name"]: r["claims"] for r in load_catalogue() if r["claims"]}
    return ('"""What the seed documents claim about each named trick, generated from the trick registry by\n'
            "`make catalogue`: do not edit (tests/test_catalogue.py fails while it differs from the registry).\n"
            'The report (report/transfer.py) reads it without importing torch. trick -> its claims."""\n'
            f"CLAIMS = {pprint.pformat(claims, width=110, sort_dicts=False)}\n")


def with_option_table(text: str) -> str:
    """The page with the generated block (between its markers) replaced by option_table()."""
    begin, end = text.index(TABLE_BEGIN) + len(TABLE_BEGIN), text.index(TABLE_END)
    return text[:begin] + "\n" + option_table() + "\n" + text[end:]


def docs_text() -> str:
    return ("# The named tricks\n\nGenerated from the trick registry (grpo_ablate/tricks/) by `make catalogue`; "
            "`grpo-ablate tricks --format md` prints the same table.\n\n" + render(load_catalogue(), "md") + "\n")


def write() -> None:
    """Rewrite every derived file from the registry."""
    (REPO / "docs" / "tricks.md").write_text(docs_text())
    OPTIONS_PAGE.write_text(with_option_table(OPTIONS_PAGE.read_text()))
    ACTIVITY_MODULE.write_text(activity_module())
    CLAIMS_MODULE.write_text(claims_module())


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m grpo_ablate.catalogue --write")
    write()
