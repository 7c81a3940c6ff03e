"""How long `grpo-ablate sweep file sweeps/X.yaml --dry-run` takes for every shipped sweep file, in a
fresh process (imports included, as a user pays them), this checkout against another side by side.

The target (issue 46): every shipped file's dry run in at most 3 s (median). The two checkouts run
interleaved, file by file and round by round, so a busy moment of the shared machine falls on both;
one untimed run of each first lets Python cache the compiled modules, as it does for any user.

    python benchmarks/dry_run.py --against /work/main         # the table docs/performance.md shows
    python benchmarks/dry_run.py --repeats 5 --only contexts
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# as a user runs it: Python caches compiled modules (a shell that sets PYTHONDONTWRITEBYTECODE, as this
# machine's does, would have every timed run compile the package again, ~0.4 s that no user pays)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


# a file whose runs this machine cannot run (rollout=vllm without vLLM) is refused here in one line; its
# dry run for a cluster plans every run as the local one would
ELSEWHERE = ["--launcher", "submitit_slurm"]


def dry_run_seconds(checkout: Path, sweep_file: Path, scratch: Path, extra: list[str]) -> float:
    """One dry run of `sweep_file` with `checkout`'s package, in a fresh process; it must succeed."""
    env = {**ENV, "PYTHONPATH": str(checkout), "WANDB_MODE": "disabled"}
    argv = [sys.executable, "-m", "grpo_ablate.cli", "sweep", "file", str(sweep_file), "--dry-run", *extra]
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=scratch, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: the dry run of {sweep_file.name} failed: {done.stderr.strip()[-500:]}")
    return seconds


def launcher_args(sweep_file: Path, scratch: Path) -> list[str]:
    """[] where this machine can run the file's runs, else ELSEWHERE."""
    env = {**ENV, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"}
    done = subprocess.run([sys.executable, "-m", "grpo_ablate.cli", "sweep", "file", str(sweep_file), "--dry-run"],
                          cwd=scratch, env=env, capture_output=True, text=True)
    return [] if done.returncode == 0 else ELSEWHERE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, help="another checkout (e.g. main's) to time side by side")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", help="the sweep files whose name contains this")
    args = parser.parse_args()
    checkouts = [REPO] + ([args.against.resolve()] if args.against else [])
    files = [f for f in sorted((REPO / "sweeps").glob("*.yaml")) if not args.only or args.only in f.name]
    with tempfile.TemporaryDirectory() as scratch:
        extra = {f: launcher_args(f, Path(scratch)) for f in files}   # also untimed: Python writes its .pyc
        for checkout in checkouts:
            dry_run_seconds(checkout, files[0], Path(scratch), extra[files[0]])
        rows = []
        for sweep_file in files:
            times = {checkout: [] for checkout in checkouts}
            for _ in range(args.repeats):
                for checkout in checkouts:
                    times[checkout].append(dry_run_seconds(checkout, sweep_file, Path(scratch), extra[sweep_file]))
            name = sweep_file.name + (" (" + " ".join(extra[sweep_file]) + ")" if extra[sweep_file] else "")
            rows.append((name, [statistics.median(times[c]) for c in checkouts]))
            print(f"{name}: " + ", ".join(f"{c}: {statistics.median(times[c]):.2f} s" for c in checkouts),
                  file=sys.stderr)
    header = ["sweep file", "this checkout s"] + ([f"{args.against} s", "ratio"] if args.against else [])
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for name, medians in rows:
        cells = [name] + [f"{m:.2f}" for m in medians] + ([f"{medians[0] / medians[1]:.2f}"] if args.against else [])
        print("| " + " | ".join(cells) + " |")
    print(f"\nmedian of {args.repeats} fresh processes each; slowest here: {max(m[0] for _, m in rows):.2f} s")


if __name__ == "__main__":
    main()
