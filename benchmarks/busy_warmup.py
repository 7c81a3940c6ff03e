"""A warm-up beside a busy machine against the same work alone: `threads: null`'s rule (rundir/cores.py)
against torch's default of every core, which is what `threads: null` was before (issue 61).

The work: the embedded default model's warm-up (hidden 128, 4 layers, batch 64) for `--steps` steps, in a
fresh process each time, timed from the first step to the last (imports and model building excluded). The
machine made busy: `--busy K` processes that each keep one core busy (`while True: pass`, as other
users' single-threaded jobs do). Four conditions, interleaved round by round so that the shared machine's
own noise falls on all of them:

    alone, 1 thread            the same work, one core
    alone, every core          torch's default on a machine nobody else uses
    busy, threads: null        the rule: the cores nobody else is using (at least 1)
    busy, every core           torch's default beside the busy processes (before: threads: null)

The machine's share: with R claims on C cores (the warm-up's, the busy processes' and whatever else the
shared machine runs, sampled while it runs: sessions where Linux shares the cores by session, its
autogroup default, else threads), each gets min(1, C / R) of a core, so a warm-up should take
max(1, R / C) / max(1, R_alone / C) times as long as alone on one thread, and no more. The table gives
each condition's median, its ratio to "alone, 1 thread", and that share.

    python benchmarks/busy_warmup.py                     # --steps 10 --repeats 3 --busy <cores>
    python benchmarks/busy_warmup.py --steps 20 --repeats 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from grpo_ablate.rundir.cores import cores, others_running  # noqa: E402

# One warm-up in this process: argv = steps, threads ("rule", "all" or a count); prints a JSON line.
WARM_UP = """
import json, sys, time
import torch
from grpo_ablate.config.compose import compose
from grpo_ablate.models import build_char_tokenizer, build_tiny_model, warm_start
from grpo_ablate.rundir.cores import cpu_threads
from grpo_ablate.tasks import build_task
steps, threads = int(sys.argv[1]), sys.argv[2]
if threads != "all":
    torch.set_num_threads(cpu_threads(None if threads == "rule" else int(threads)))
cfg = compose([])
task = build_task(cfg.task)
tokenizer = build_char_tokenizer(task.chars)
warmup = cfg.model.warmup
model = build_tiny_model(dict(cfg.model.arch), tokenizer, seed=int(warmup.seed))
print("started", flush=True)
started = time.perf_counter()
warm_start(model, tokenizer, task, steps=steps, batch_size=int(warmup.batch_size), lr=float(warmup.lr),
           seed=int(warmup.seed), slip_prob=float(warmup.slip_prob), log=lambda *a: None)
print(json.dumps({"seconds": time.perf_counter() - started, "threads": torch.get_num_threads()}))
"""
# torch's default is every core unless OMP_NUM_THREADS says otherwise: the children get none
ENV = {**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}, "PYTHONPATH": str(REPO)}
CONDITIONS = (("alone, 1 thread", False, "1"), ("alone, every core", False, "all"),
              ("busy, threads: null", True, "rule"), ("busy, every core", True, "all"))


def warm_up(steps: int, threads: str) -> dict:
    """One warm-up in a fresh process: its seconds and threads, and `claims`, the mean number of
    claims on the cores meanwhile (`claims_now`, the warm-up's own included; sampled every 50 ms)."""
    child = subprocess.Popen([sys.executable, "-c", WARM_UP, str(steps), threads], env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    seen = []
    child.stdout.readline()   # "started": the claims are counted while the warm-up itself runs
    while child.poll() is None:
        seen.append(claims_now())
        time.sleep(0.05)
    out, err = child.communicate()
    if child.returncode != 0:
        raise SystemExit(f"the warm-up failed: {err.strip()[-500:]}")
    sample = json.loads(out.strip().splitlines()[-1])
    return {**sample, "claims": statistics.mean(seen) if seen else float("nan")}


def claims_now() -> int:
    """How many share the cores right now. Linux with autogroup (sched_autogroup_enabled: a desktop's
    and this machine's default) shares them between sessions, so: the sessions that have a thread
    running or ready to run; without it, between threads: those threads. This process is left out (its
    session is the warm-up's)."""
    running = []
    for stat in Path("/proc").glob("[0-9]*/task/*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()   # after "(comm)": state, ppid, pgrp, session
        except (OSError, IndexError):
            continue
        if fields[0] == "R" and stat.parts[2] != str(os.getpid()):
            running.append(fields[3])
    return len(set(running)) if AUTOGROUP else len(running)


def autogroup() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


AUTOGROUP = autogroup()


def start_busy(k: int) -> list[subprocess.Popen]:
    """`k` processes that each keep one core busy, each in a session of its own, as another user's job is."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(k)]
    time.sleep(1.0)   # running before the warm-up looks at the machine
    return procs


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy", type=int, default=cores(), help="busy processes (default: one per core)")
    args = parser.parse_args()
    samples: dict[str, list[dict]] = {name: [] for name, _, _ in CONDITIONS}
    print(f"{cores()} cores, {args.busy} busy processes, {args.steps} warm-up steps, {args.repeats} rounds; "
          f"others running at the start: {others_running():.2f}; claims counted by "
          f"{'session (autogroup)' if AUTOGROUP else 'thread'}", flush=True)
    warm_up(1, "1")   # untimed: Python's compiled modules and the OS's file cache, as any user has them
    for round_ in range(args.repeats):
        for name, busy, threads in CONDITIONS:
            procs = start_busy(args.busy) if busy else []
            try:
                sample = warm_up(args.steps, threads)
            finally:
                stop(procs)
            samples[name].append(sample)
            print(f"round {round_ + 1}  {name:<20} {sample['seconds']:7.2f} s  {sample['threads']} thread(s)  "
                  f"{sample['claims']:.1f} claims", flush=True)
    print_table(samples)


def print_table(samples: dict[str, list[dict]]) -> None:
    """Each condition's median and its ratio to alone on 1 thread, beside the ratio the machine's share
    predicts: with R claims on C cores (claims_now) each gets min(1, C / R) of a core, so a condition
    should take max(1, R / C) / max(1, R_alone / C) times as long as alone on 1 thread, and no more."""
    def median(name, key):
        return statistics.median(s[key] for s in samples[name])

    base, share_base = median("alone, 1 thread", "seconds"), max(1.0, median("alone, 1 thread", "claims") / cores())
    print("\n| condition | threads | median s | × alone, 1 thread | claims (median) | × by the machine's share |")
    print("|---|---|---|---|---|---|")
    for name, _, _ in CONDITIONS:
        threads = "/".join(sorted({str(s["threads"]) for s in samples[name]}))
        claims = median(name, "claims")
        share = max(1.0, claims / cores()) / share_base
        print(f"| {name} | {threads} | {median(name, 'seconds'):.2f} | {median(name, 'seconds') / base:.2f} | "
              f"{claims:.1f} | {share:.2f} |")


if __name__ == "__main__":
    main()
