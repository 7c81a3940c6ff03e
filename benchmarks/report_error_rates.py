"""The report's error rates and power on simulated sweeps whose truth is known (tests/report_sim.py),
through the report's own functions (tests/test_error_control.py checks they decide as
`grpo-ablate report` does). Prints one JSON line per measurement; docs/statistics.md quotes them.

    .venv/bin/python benchmarks/report_error_rates.py [--sweeps 2000]
"""
import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from report_sim import fast_verdicts, simulate  # noqa: E402

DECIDED = ("helps", "hurts")


def share(hits: int, n: int) -> dict:
    p = hits / n
    return {"rate": round(p, 4), "mc_se": round(math.sqrt(max(p * (1 - p), 1e-12) / n), 4), "n": n}


def null_reports(sweeps: int, summary: str, seeds: int) -> dict:
    rng = np.random.default_rng(11)
    counts = {"holm": 0, "bh": 0, "none": 0, "holm_seeds_only": 0}
    for _ in range(sweeps):
        _, scores = simulate(rng, seeds=seeds)
        for method in ("holm", "bh", "none"):
            counts[method] += any(v["verdict"] in DECIDED for v in fast_verdicts(scores, method, summary=summary)
                                  .values())
        counts["holm_seeds_only"] += any(v["verdict"] in DECIDED for v in fast_verdicts(
            scores, "holm", summary=summary, seeds_only=True).values())
    return {k: share(v, sweeps) for k, v in counts.items()}


def problem_heterogeneity(sweeps: int) -> dict:
    rng = np.random.default_rng(12)
    out = {}
    for only in (False, True):
        called = total = 0
        for _ in range(sweeps):
            _, scores = simulate(rng, tricks=2, problem_spread=0.5)
            v = fast_verdicts(scores, "none", seeds_only=only)
            called += sum(x["verdict"] in DECIDED for x in v.values())
            total += len(v)
        out["seeds_only" if only else "seeds_x_problems"] = share(called, total)
    return out


def power(sweeps: int, effect: float, summary: str) -> dict:
    rng = np.random.default_rng(13)
    helps = 0
    deltas = []
    for _ in range(sweeps):
        _, scores = simulate(rng, effects={"t0": effect})
        v = fast_verdicts(scores, summary=summary)["t0"]
        helps += v["verdict"] == "helps"
        deltas.append(v["delta"].mean)
    return {"effect_logit": effect, "mean_delta_accuracy": round(float(np.mean(deltas)), 4),
            "helps": share(helps, sweeps)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweeps", type=int, default=2000)
    args = parser.parse_args()
    for summary in ("final", "last_3"):
        for seeds in (3, 5):
            print(json.dumps({"measure": "null six-trick leave-one-out, any false helps/hurts per report",
                              "summary": summary, "seeds": seeds, **null_reports(args.sweeps, summary, seeds)}))
    print(json.dumps({"measure": "per contrast, trick moves each problem by ±0.5 of its headroom (mean 0 over the "
                                 "task), no control",
                      **problem_heterogeneity(args.sweeps // 2)}))
    for effect in (0.5, 1.0):
        for summary in ("final", "last_3"):
            print(json.dumps({"measure": "power, one true effect among six, five seeds, Holm", "summary": summary,
                              **power(args.sweeps // 2, effect, summary)}))


if __name__ == "__main__":
    main()
