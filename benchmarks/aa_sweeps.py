"""Repeated A/A sweeps, read together: how many named a placebo, against what the error control predicts.

Each sweep dir is a finished `grpo-ablate sweep aa` whose report.json holds the A/A check (report/placebo.py).
A sweep fails when its report names a placebo (a *helps*, *hurts* or *breaks training* between identical arms).
Under the report's error control each fails with probability at most its stated chance (Holm: alpha), so the
number of failures among n independent sweeps is at most Binomial(n, chance): printed with P(at least this many).
The noise floor per summary is the root mean square over sweeps of each sweep's SD of Δ between identical arms.

    .venv/bin/python benchmarks/aa_sweeps.py runs/sweeps/aa-*          # reports them first where missing
"""
import argparse
import json
import math
import sys
from pathlib import Path

from scipy.stats import binom


def read_report(sweep: Path) -> dict:
    path = sweep / "report.json"
    if not path.exists():
        from grpo_ablate.report.build import build_report
        from grpo_ablate.report.write import write_report   # as `grpo-ablate report --no-figures` writes it
        write_report(build_report(sweep), sweep, figures=False)
    return json.loads(path.read_text())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", nargs="+", type=Path)
    args = parser.parse_args(argv)
    rows, floors, chance, raw = [], {}, None, []
    for sweep in args.sweeps:
        report = read_report(sweep)
        section = report.get("placebo")
        if section is None:
            print(f"error: {sweep}: not an A/A sweep (its report has no A/A check)", file=sys.stderr)
            return 2
        chance = section["chance"] if chance is None else max(chance, section["chance"])
        named = [f"{n['placebo']} {n['verdict']}" for n in section["named"]]
        chosen = next(f for f in section["floors"] if f["chosen"])
        closest = min(report["verdicts"], key=lambda v: v["delta"]["p"] if v["delta"]["p"] is not None
                      else math.inf)   # the placebo nearest to being named: how much room the sweep had
        raw += [v["delta"]["p"] for v in report["verdicts"] if v["delta"]["p"] is not None]
        d = closest["delta"]
        rows.append((sweep.name, section["seeds"], named, chosen["sd"], chosen["detectable"], closest["trick"],
                     d["mean"], d["p"], d["p_adjusted"]))
        for f in section["floors"]:
            floors.setdefault(f["summary"], []).append(f["sd"])
    print("| sweep | seeds | placebos named | SD of Δ (compared summary) | detectable (80%) | closest placebo: Δ, "
          "p, adjusted p |")
    print("|---|---|---|---|---|---|")
    for name, seeds, named, sd, detectable, trick, delta, p, adjusted in rows:
        print(f"| {name} | {seeds} | {', '.join(named) or 'none'} | {sd:.4f} | {detectable:.3f} | {trick}: "
              f"{delta:+.3f}, {p:.2g}, {adjusted:.2g} |")
    n, failed = len(rows), sum(bool(r[2]) for r in rows)
    print(f"\n{failed} of {n} A/A sweeps named a placebo; the error control predicts at most {n * chance:.2f} "
          f"({chance:.0%} each), and {failed} or more with probability at most {binom.sf(failed - 1, n, chance):.3f}.")
    print(f"unadjusted: {sum(p < 0.05 for p in raw)} of {len(raw)} placebo tests had p < 0.05 (5% expected per "
          "test; the tests of one sweep share its reference arm, so they are not independent)")
    print("noise floor (RMS over sweeps of the SD of Δ between identical arms): "
          + ", ".join(f"{s} {math.sqrt(sum(v * v for v in sds) / len(sds)):.4f}" for s, sds in floors.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
