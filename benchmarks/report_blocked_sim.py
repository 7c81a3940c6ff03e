"""The blocked model's error rate and power through the report's real path: simulated leave-one-out
sweeps (tests/report_sim.py) written to disk as the sweep command writes them, each read by
`build_report` (what `grpo-ablate report` runs; tests/test_error_control.py checks the CLI decides
the same), decided on last_3. Each report gives both tests: its verdicts (blocked, the default) and
its sensitivity line (paired t per contrast), Holm at 5% over the six contrasts either way.

Scenarios (null: no trick has an effect): equal variances; the variants' run-noise SDs spread
0.33–3× (a random one of seven factors each); Student-t (3 df) run noise; one arm that diverges in
2 of 5 seeds; the hub (`all`) 3× noisier than every leaf. Power: one true effect (+0.33 on the
logit scale, about +0.05 accuracy) among six, equal variances. Prints one JSON line per scenario;
docs/statistics.md quotes them.

    .venv/bin/python benchmarks/report_blocked_sim.py [--sweeps 500] [--seeds 5]
"""
import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from report_sim import write_sweep  # noqa: E402

from grpo_ablate.report.build import build_report  # noqa: E402

DECIDED = ("helps", "hurts")
NAMES = ["all"] + [f"drop-t{i}" for i in range(6)]
SCENARIOS = {
    "equal variances": lambda rng, seeds: {},
    "SDs spread 0.33-3x": lambda rng, seeds: {"sd_scale": dict(zip(NAMES, rng.permutation(np.geomspace(1 / 3, 3, 7))))},
    "t3 run noise": lambda rng, seeds: {"noise": "t3"},
    "one arm diverges in 2 of 5 seeds": lambda rng, seeds: {
        "broken": {("drop-t0", int(s)) for s in rng.choice(seeds, 2, replace=False)}},
    "hub 3x noisier": lambda rng, seeds: {"sd_scale": {"all": 3.0}},
}
POWER_EFFECT = 0.33


def share(hits: int, n: int) -> dict:
    p = hits / n
    return {"rate": round(p, 4), "mc_se": round(math.sqrt(max(p * (1 - p), 1e-12) / n), 4), "n": n}


def run(scenario: str, sweeps: int, seeds: int, effect: float = 0.0) -> dict:
    rng = np.random.default_rng(100 * list(SCENARIOS).index(scenario) + round(100 * effect))
    root = Path(tempfile.mkdtemp(prefix="blocked-sim-"))
    false = {"blocked": 0, "paired": 0}
    helps = {"blocked": 0, "paired": 0}
    deltas, dfs = [], []
    try:
        for i in range(sweeps):
            options = SCENARIOS[scenario](rng, seeds)
            path, _ = write_sweep(root / f"s{i}", rng, seeds=seeds, effects={"t0": effect} if effect else None,
                                  **options)
            report = build_report(path, summary="last_3")
            blocked = {v["trick"]: v["verdict"] for v in report.verdicts}
            paired = {t: v["verdict"] for t, v in report.sensitivity["verdicts"].items()}
            for test, verdicts in (("blocked", blocked), ("paired", paired)):
                false[test] += any(v in DECIDED for t, v in verdicts.items() if not (effect and t == "t0"))
                helps[test] += bool(effect) and verdicts["t0"] == "helps"
            t0 = next(v for v in report.verdicts if v["trick"] == "t0")
            deltas.append(t0["delta"].mean)
            dfs.append(t0["delta"].df)
            shutil.rmtree(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = {"scenario": scenario, "seeds": seeds, "false_report": {k: share(v, sweeps) for k, v in false.items()},
           "median_df_t0": round(float(np.nanmedian([d for d in dfs if d is not None])), 1)}
    if effect:
        out.update({"effect_logit": effect, "mean_delta_accuracy": round(float(np.mean(deltas)), 4),
                    "power": {k: share(v, sweeps) for k, v in helps.items()},
                    "power_ratio": round(helps["blocked"] / max(1, helps["paired"]), 2)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweeps", type=int, default=500)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--only", default=None, help="one scenario name, or 'power'")
    args = parser.parse_args()
    for scenario in SCENARIOS:
        if args.only in (None, scenario):
            print(json.dumps(run(scenario, args.sweeps, args.seeds)), flush=True)
    if args.only in (None, "power"):
        print(json.dumps({"measure": "power", **run("equal variances", args.sweeps, args.seeds, POWER_EFFECT)}),
              flush=True)


if __name__ == "__main__":
    main()
