"""The package's rooms by size: a printed report for reviewers, not a gate.

A module holds one job and a function reads on one screen; the lines below are where a reader
should ask whether a room holds two jobs, not limits that code is squeezed under (a gate made
files stop at 499 lines and functions at 60, split at the cap rather than by what they do).
`make lint` prints it.

    python scripts/room_sizes.py            # the rooms past the guide lines, and the largest
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "grpo_ablate"
FUNCTION_GUIDE, MODULE_GUIDE = 60, 500    # lines, docstrings included


def rooms(path: Path) -> tuple[int, list[tuple[str, int]]]:
    """A module's line count and its functions' (name, lines)."""
    source = path.read_text()
    functions = [(f"{fn.name}:{fn.lineno}", fn.end_lineno - fn.lineno + 1) for fn in ast.walk(ast.parse(source))
                 if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return source.count("\n"), functions


def past_the_guides(paths, measured: dict | None = None) -> list[str]:
    """Every module past MODULE_GUIDE lines and function past FUNCTION_GUIDE, as 'where: n lines'
    (`measured`: path -> rooms(path), where the caller has them already)."""
    found = []
    for path in paths:
        lines, functions = measured[path] if measured else rooms(path)
        where = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path.name
        found += [f"{where}: {lines} lines"] if lines > MODULE_GUIDE else []
        found += [f"{where}:{name.split(':')[1]} {name.split(':')[0]}: {n} lines"
                  for name, n in functions if n > FUNCTION_GUIDE]
    return found


def main(top: int = 5) -> None:
    measured = {path: rooms(path) for path in sorted(PACKAGE.rglob("*.py"))}   # each module parsed once
    sizes = sorted(((lines, p) for p, (lines, _) in measured.items()), reverse=True)
    longest = sorted(((n, p, name) for p, (_, functions) in measured.items() for name, n in functions), reverse=True)
    past = past_the_guides(measured, measured)
    print(f"room sizes: {len(measured)} modules, {len(past)} rooms past the guides "
          f"({MODULE_GUIDE} lines a module, {FUNCTION_GUIDE} a function)")
    for line in past:
        print(f"  past: {line}")
    print("  largest modules: " + ", ".join(f"{p.relative_to(PACKAGE.parent)} {n}" for n, p in sizes[:top]))
    print("  longest functions: " + ", ".join(f"{name.split(':')[0]} ({p.name}) {n}" for n, p, name in longest[:top]))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
