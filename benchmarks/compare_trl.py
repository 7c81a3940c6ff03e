"""W1 side by side: grpo-ablate ("ours") against Hugging Face TRL's GRPOTrainer, in one run.

    python benchmarks/compare_trl.py [--rounds 3] [--steps 12] [--assets DIR]
                                     [--retries 2] [--idle-wait 120] [--timeout 900]

For beta in (0.04, 0.0) it runs rounds of `w1.py --impl ours`, `w1.py --impl trl`, ours, trl,
... each as a fresh subprocess (so each peak RSS belongs to one implementation, and both see
the same machine conditions, interleaved), then prints ONE JSON line per beta:

    {"beta", "rounds", "steps",
     "ours": {"median_s", "round_medians_s", "peak_rss_mb", "split", "foreign_cpu_cores_max"},
     "trl":  {...same...},
     "ratio_ours_over_trl": {"median_of_round_ratios", "ratio_of_medians"},
     "loadavg_1m_start"}

median_s is the median over rounds of each round's median s/step; the split fields are
medians over rounds; peak_rss_mb is the largest over rounds; foreign_cpu_cores_max is the
most CPU (in cores) that other processes used during any of the runs. The machine is shared
and noisy: compare only within one run, as a ratio (W1.md). With 2 torch threads on a 2-core
machine, any other busy process slows a step by far more than 2x (one busy core: up to 80x
measured), so run this on an idle machine. Before each run it waits (up to --idle-wait s) for
other processes to go quiet; a run during which they used more than 0.1 core is rerun (up to
--retries times), then kept with a warning.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
W1 = BENCH_DIR / "w1.py"
DEFAULT_ASSETS = BENCH_DIR.parent / "runs" / "bench" / "w1_assets"
BETAS = (0.04, 0.0)
IMPLS = ("ours", "trl")  # order within a round
SPLIT_KEYS = ("generate_s", "reference_s", "update_s")
FOREIGN_CPU_WARN = 0.1  # cores used by other processes during a run before we warn
TRL_MISSING = "trl is not installed: pip install -e '.[bench]'"


def cpu_busy_s() -> float | None:
    """CPU seconds all processes have spent busy since boot (Linux /proc/stat), else None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_for_idle(max_wait_s: float, window_s: float = 2.0) -> bool:
    """Wait until the machine is idle for `window_s` (other CPU < FOREIGN_CPU_WARN cores)."""
    deadline = time.monotonic() + max_wait_s
    while True:
        busy0 = cpu_busy_s()
        if busy0 is None:
            return True  # cannot tell (no /proc/stat)
        time.sleep(window_s)
        if (cpu_busy_s() - busy0) / window_s < FOREIGN_CPU_WARN:
            return True
        if time.monotonic() > deadline:
            return False


def run_w1(impl: str, beta: float, steps: int, assets: str, timeout: float) -> dict:
    """One fresh `w1.py` process; returns its JSON result (the last line of its stdout).

    Adds "foreign_cpu_cores": the CPU that processes other than the w1.py child kept busy during
    its run, in cores (machine busy time minus the child's own CPU time, over wall time). W1 uses
    2 threads, so on a 2-core machine anything above ~0.1 means the timing is contaminated.
    """
    cmd = [sys.executable, str(W1), "--impl", impl, "--beta", str(beta), "--steps", str(steps),
           "--assets", assets]
    busy0, child0, t0 = cpu_busy_s(), children_cpu_s(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    busy1, child1, t1 = cpu_busy_s(), children_cpu_s(), time.perf_counter()
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        print(f"{' '.join(cmd[1:])} failed (exit {proc.returncode}):\n{tail}", file=sys.stderr)
        raise SystemExit(proc.returncode)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if busy0 is not None:
        foreign = max(0.0, (busy1 - busy0) - (child1 - child0)) / (t1 - t0)
        result["foreign_cpu_cores"] = round(foreign, 2)
    return result


def aggregate(results: list[dict]) -> dict:
    """One implementation's results over the rounds."""
    medians = [r["median_s"] for r in results]
    return {
        "median_s": round(statistics.median(medians), 4),
        "round_medians_s": medians,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
        "split": {
            k: round(statistics.median(r["split"][k] for r in results), 4) for k in SPLIT_KEYS
        },
        "foreign_cpu_cores_max": max(r.get("foreign_cpu_cores", 0.0) for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--assets", default=str(DEFAULT_ASSETS), help="W1 model+tokenizer dir")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per w1.py run")
    parser.add_argument("--retries", type=int, default=2,
                        help="reruns of a run during which other processes were busy")
    parser.add_argument("--idle-wait", type=float, default=120,
                        help="seconds to wait for an idle machine before each run")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")

    if importlib.util.find_spec("trl") is None:
        print(TRL_MISSING, file=sys.stderr)
        raise SystemExit(2)

    # Build the assets once, in their own process, so no timed process pays for (or holds the
    # memory of) building them.
    subprocess.run([sys.executable, str(BENCH_DIR / "w1_assets.py"), args.assets], check=True,
                   stdout=subprocess.DEVNULL)

    for beta in BETAS:
        load = os.getloadavg()[0]  # reported as a hint; the per-run check is foreign_cpu_cores
        results: dict[str, list[dict]] = {impl: [] for impl in IMPLS}
        for rnd in range(args.rounds):
            for impl in IMPLS:
                for attempt in range(args.retries + 1):
                    if not wait_for_idle(args.idle_wait):
                        print(f"[compare] machine still busy after {args.idle_wait:.0f} s; "
                              "running anyway", file=sys.stderr)
                    res = run_w1(impl, beta, args.steps, args.assets, args.timeout)
                    print(f"[compare] beta={beta} round {rnd + 1}/{args.rounds} {impl}: "
                          f"{res['median_s']:.4f} s/step, {res['peak_rss_mb']} MB, other "
                          f"processes used {res.get('foreign_cpu_cores', float('nan')):.2f} cores",
                          file=sys.stderr)
                    if res.get("foreign_cpu_cores", 0.0) <= FOREIGN_CPU_WARN:
                        break
                    again = "rerunning" if attempt < args.retries else "keeping it anyway"
                    print(f"[compare] warning: other processes were busy during that run, its "
                          f"timing is not trustworthy; {again}", file=sys.stderr)
                results[impl].append(res)

        ours, trl = aggregate(results["ours"]), aggregate(results["trl"])
        round_ratios = [
            o["median_s"] / t["median_s"] for o, t in zip(results["ours"], results["trl"])
        ]
        print(json.dumps({
            "beta": beta,
            "rounds": args.rounds,
            "steps": args.steps,
            "ours": ours,
            "trl": trl,
            "ratio_ours_over_trl": {
                "median_of_round_ratios": round(statistics.median(round_ratios), 4),
                "ratio_of_medians": round(ours["median_s"] / trl["median_s"], 4),
            },
            "loadavg_1m_start": round(load, 2),
        }), flush=True)


if __name__ == "__main__":
    main()
