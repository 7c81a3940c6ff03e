"""Micro-batches on a real model: the same step at a lower peak memory.

    python benchmarks/micro_batch_memory.py [--sizes none,8,4,2] [--steps 2] [--base "..."] [overrides ...]

`make demo-real`'s setup (SmolLM2-135M-Instruct, LoRA, task=quiz, 4 prompts x 4 completions; or
`--base`'s overrides) trains `--steps` steps once per `updates.micro_batch_size` in `--sizes`
(none: the whole batch in one forward), each in a fresh process. Peak memory: the process's
resident set, sampled every 2 ms during each step, less the resident set just before it (glibc
returns every allocation of 128 KiB or more to the system at once, MALLOC_MMAP_THRESHOLD_: the
resident set follows the live tensors). On a
CUDA machine the model trains there and the peak is the step's torch.cuda.max_memory_allocated
(perf/peak_memory_gib) instead.
Prints one JSON line per size: the median peak over the steps, and the three largest relative
differences of a logged metric (timings and memory left out) from the unsplit run's: float32
reordering (a group's advantages sum to zero, so a step-0 gradient is a small difference of large
terms and its norm carries the reordering most).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import threading

DEMO_REAL = ("model=smollm2 task=quiz task.kind=larger task.eval_size=32 model.lora.r=16 kl=none optim.lr=3e-4 "
             "rollout.prompts_per_step=4 rollout.group_size=4 rollout.max_new_tokens=16 eval.every=2 threads=1")


def child(overrides: list[str], steps: int) -> None:
    """One run in this process: each step's metrics and its peak resident set above the step's start."""
    import psutil
    import torch

    from grpo_ablate.config.compose import compose
    from grpo_ablate.config.validate import validate
    from grpo_ablate.config.spec import run_spec
    from grpo_ablate.train.distributed import DataParallel
    from grpo_ablate.train.grpo import build_grpo

    cfg = compose(overrides)
    validate(cfg)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    trainer, _ = build_grpo(run_spec(cfg), device, DataParallel(), None, lambda *a, **k: None)
    process = psutil.Process()
    for step in range(steps):
        start, peak, running = process.memory_info().rss, [0], [True]

        def sample():
            while running[0]:
                peak[0] = max(peak[0], process.memory_info().rss)
                threading.Event().wait(0.002)
        watcher = threading.Thread(target=sample)
        watcher.start()
        metrics = trainer.step(step).metrics
        running[0] = False
        watcher.join()
        if device.type == "cuda":   # the step resets the peak at its start
            peak[0], start = torch.cuda.max_memory_allocated(device), 0
        print(json.dumps({"step": step, "peak_mib": (peak[0] - start) / 2 ** 20, "metrics": metrics}), flush=True)


def run(size: str, steps: int, base: str, extra: list[str]) -> list[dict]:
    overrides = [*shlex.split(base), *extra] + ([] if size == "none" else [f"updates.micro_batch_size={size}"])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, __file__, "--child", "--steps", str(steps), *overrides],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"micro_batch_size={size} failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def largest_differences(rows: list[dict], whole: list[dict], count: int = 3) -> list[tuple]:
    """The largest relative differences of the metrics from the unsplit run's: (relative, name, unsplit,
    split); a loss near zero (a group's advantages sum to zero) shows a large relative one."""
    found = []
    for row, ref in zip(rows, whole):
        for name, value in ref["metrics"].items():
            if name.startswith(("time/", "perf/")) or not isinstance(value, (int, float)):
                continue
            found.append((abs(row["metrics"][name] - value) / max(abs(value), 1e-8), f"{name}@{row['step']}",
                          value, row["metrics"][name]))
    return sorted(found, reverse=True)[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="none,8,4,2")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--base", default=DEMO_REAL, help="the run's overrides (default: make demo-real's)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args, extra = parser.parse_known_args()
    if args.child:
        return child(extra, args.steps)
    whole = None
    for size in args.sizes.split(","):
        rows = run(size, args.steps, args.base, extra)
        whole = whole or rows
        print(json.dumps({"micro_batch_size": size, "peak_mib_median": statistics.median(r["peak_mib"] for r in rows),
                          "peak_mib": [round(r["peak_mib"], 1) for r in rows],
                          "largest_rel_metric_diffs": largest_differences(rows, whole)}), flush=True)


if __name__ == "__main__":
    main()
