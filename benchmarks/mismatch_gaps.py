"""The sampler-trainer gap of a finished sweep, per context and variant (docs/vllm_cpu.md).

    python benchmarks/mismatch_gaps.py runs/sweeps/<sweep dir>

Reads every run's metrics.jsonl and prints a markdown table: per (context, variant), over the
runs' training steps, the median of rollout/logprob_gap_mean (nats a token, sampler vs the
trainer's pi_old), the largest rollout/logprob_gap_max, and the rollout-correction activity
(rollout_corr/logp_diff_mean, and the truncated / masked fractions where the option logs them),
with the runs' final eval/accuracy. Run names are `<variant>@<context>-s<seed>`.
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ACTIVITY = ("rollout_corr/truncated_frac", "rollout_corr/masked_frac", "rollout_corr/is_fraction_high")


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def collect(sweep: Path) -> dict:
    table = defaultdict(lambda: defaultdict(list))
    for run in sorted(p for p in sweep.iterdir() if (p / "metrics.jsonl").exists()):
        variant, _, rest = run.name.partition("@")
        context = rest.rsplit("-s", 1)[0]
        metrics = rows(run)
        cell = table[(context, variant)]
        for row in metrics:
            for key in ("rollout/logprob_gap_mean", "rollout/logprob_gap_max", "rollout_corr/logp_diff_mean",
                        *ACTIVITY):
                if key in row:
                    cell[key].append(row[key])
        finals = [r["eval/accuracy"] for r in metrics if "eval/accuracy" in r]
        if finals:
            cell["final"].append(finals[-1])
    return table


def main() -> None:
    table = collect(Path(sys.argv[1]))
    print("| context | variant | gap mean (median over steps) | gap max | logp_diff_mean | truncated/masked frac "
          "| final eval acc (per seed) |")
    print("|---|---|---|---|---|---|---|")
    for (context, variant), cell in sorted(table.items()):
        active = max((max(cell[k]) for k in ACTIVITY if cell[k]), default=None)
        diff = cell["rollout_corr/logp_diff_mean"]
        print(f"| {context} | {variant} | {statistics.median(cell['rollout/logprob_gap_mean']):.2e} "
              f"| {max(cell['rollout/logprob_gap_max']):.2e} | {'-' if not diff else f'{statistics.median(diff):.2e}'} "
              f"| {'-' if active is None else f'{active:.3f}'} | {' / '.join(f'{a:.3f}' for a in cell['final'])} |")


if __name__ == "__main__":
    main()
