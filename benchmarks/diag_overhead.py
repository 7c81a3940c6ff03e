"""What the gradient-conflict diagnostics cost: median s/step with them off and on, side by side.

    python benchmarks/diag_overhead.py [--steps 30] [--rounds 2] [--threads 1] [overrides ...]

Runs `grpo-ablate train` on the embedded default (plus any overrides) with
`diag.grad_conflict=false`, with it on at every step (`diag.every=1`: the cost of one
diagnosed step) and on at the default `diag.every`, each in a fresh process, alternating
the three for `--rounds` rounds so that a busy shared machine disturbs them alike. Prints
one JSON line per configuration: the median and the mean of `time/step_s` over all its
steps (evaluation is outside `time/step_s`; with diag.every > 1 the median is an undiagnosed
step, the mean spreads the diagnosed ones), the median of `time/diag_s` over the diagnosed
steps and its median share of their `time/step_s` (measured inside the same steps, so the
least disturbed by a busy machine), and the overhead of each relative to off.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIGS = {
    "off": ["diag.grad_conflict=false"],
    "on, every step": ["diag.grad_conflict=true", "diag.every=1"],
    "on, default every": ["diag.grad_conflict=true"],
}


def one_run(overrides: list[str], steps: int, threads: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="diag-overhead-") as run_dir:
        args = [*overrides, f"steps={steps}", "logger=none", f"threads={threads}", f"eval.every={steps}",
                f"hydra.run.dir={run_dir}/run"]
        env = {**os.environ, "WANDB_MODE": "disabled"}
        done = subprocess.run([sys.executable, "-m", "grpo_ablate.cli", "train", *args], env=env,
                              capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"run failed: {' '.join(args)}\n{done.stderr[-2000:]}")
        lines = Path(run_dir, "run", "metrics.jsonl").read_text().splitlines()
        return [row for row in map(json.loads, lines) if row["step"] >= 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (1: a shared machine)")
    args, overrides = parser.parse_known_args()
    rows = {name: [] for name in CONFIGS}
    for _ in range(args.rounds):
        for name, extra in CONFIGS.items():
            # the first step of a process pays one-off costs (allocations, lazy imports): dropped
            rows[name] += one_run([*overrides, *extra], args.steps, args.threads)[1:]
    off = [r["time/step_s"] for r in rows["off"]]
    for name, runs in rows.items():
        steps = [r["time/step_s"] for r in runs]
        median, mean = statistics.median(steps), statistics.fmean(steps)
        diag = [r["time/diag_s"] for r in runs if "time/diag_s" in r]
        share = [r["time/diag_s"] / r["time/step_s"] for r in runs if "time/diag_s" in r]
        print(json.dumps({"config": name, "steps": len(runs), "median_step_s": round(median, 4),
                          "mean_step_s": round(mean, 4),
                          "median_diag_s": round(statistics.median(diag), 4) if diag else None,
                          "diag_share_of_step": f"{100 * statistics.median(share):.1f}%" if share else None,
                          "overhead_median": f"{100 * (median / statistics.median(off) - 1):+.1f}%",
                          "overhead_mean": f"{100 * (mean / statistics.fmean(off) - 1):+.1f}%"}), flush=True)


if __name__ == "__main__":
    main()
