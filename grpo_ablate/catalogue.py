"""The trick catalogue as data: every named trick file in conf/trick/, for `grpo-ablate tricks`.

The trick files are the single source: each records its family, option, what it changes,
its reference, the seed review's verdict and the extra compute it costs.
"""
from __future__ import annotations

import json
from importlib import resources

import yaml

from grpo_ablate.inert import requirement

COLUMNS = ("name", "family", "option", "what", "source", "verdict", "cost")


def load_catalogue() -> list[dict]:
    rows = []
    for entry in sorted(resources.files("grpo_ablate.conf").joinpath("trick").iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".yaml"):
            name = entry.name[: -len(".yaml")]
            info = yaml.safe_load(entry.read_text())["tricks"][name]
            row = {"name": name, **{k: str(info[k]) for k in COLUMNS[1:]}}
            row["requires"] = requirement(row["family"], row["option"]) or "-"   # when it can act at all
            rows.append(row)
    return rows


def render(rows: list[dict], fmt: str) -> str:
    """`json` or `md` text (the `table` form is drawn by the CLI with rich)."""
    if fmt == "json":
        return json.dumps(rows, indent=2)
    head = "| trick | family=option | what it changes | source | seed review | extra compute | acts only with |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['name']}` | `{r['family']}={r['option']}` | {r['what']} | {r['source']} | "
                     f"{r['verdict'].replace('_', ' ')} | {r['cost']} | {r['requires']} |")
    return "\n".join(lines)
