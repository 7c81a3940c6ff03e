"""What the template-collapse diagnostic costs: a default step with it off and on, side by side in one process.

    python benchmarks/input_dependence_overhead.py [--pairs 30] [--threads 1] [overrides ...]

Builds the trainer of the embedded default (plus any overrides) once, then runs the same training
step again and again from the same weights and state (the weights, AdamW's moments and the sampler's
stream restored before each, so every repetition samples, scores and updates exactly the same
batch), alternating the diagnostic off (`diag.input_dependence_every=0`, the default) and on (its
forward on `diag.input_dependence_rows` completions, every step), `--pairs` times each; the order
within each pair alternates too. Side by side in one process, the two see the same machine: across
fresh processes, the load of a shared 2-core machine moves the median step by +-10% from one run to
the next, more than the diagnostic costs.

Prints one JSON line: the median `time/step_s` off and on (evaluation and the restore are outside
it), the median of the on-off differences pair by pair, both as a share of the median step off, the
median `time/input_dependence_s` (the diagnostic's own forward, timed inside the step) and its share
of the steps it was in, and the same medians of `time/update_s`, the phase the forward is in.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
from dataclasses import replace

import torch

from grpo_ablate.config.compose import compose
from grpo_ablate.config.spec import run_spec
from grpo_ablate.config.validate import validate
from grpo_ablate.train.distributed import DataParallel
from grpo_ablate.train.grpo import build_grpo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: a shared machine)")
    args, overrides = parser.parse_known_args()
    torch.set_num_threads(args.threads)
    cfg = compose(["logger=none", *overrides])
    validate(cfg)
    trainer, _ = build_grpo(run_spec(cfg), torch.device("cpu"), DataParallel(), None, lambda *a, **k: None)
    start = (copy.deepcopy(trainer.model.state_dict()), copy.deepcopy(trainer.state_dict()))

    def step(every: int) -> dict:
        trainer.model.load_state_dict(start[0])
        trainer.load_state_dict(copy.deepcopy(start[1]))
        trainer.input_dependence_every = every
        trainer.spec = replace(trainer.spec, diag=replace(trainer.spec.diag, input_dependence_every=every))
        return trainer.step(1).metrics

    step(0), step(1)                       # one-off allocations and lazy imports, both paths
    off, on = [], []
    for i in range(args.pairs):
        for every in ((0, 1) if i % 2 == 0 else (1, 0)):
            (on if every else off).append(step(every))
    trained = lambda row: {k: v for k, v in row.items() if not k.startswith(("time/", "perf/", "diag/"))}
    if any(trained(a) != trained(b) for a, b in zip(off, on)):   # the same work each time, or no comparison
        raise SystemExit("the repeated steps differ: the comparison would not be of the same work")
    median = lambda rows, key: statistics.median(r[key] for r in rows)
    base = median(off, "time/step_s")
    differences = [b["time/step_s"] - a["time/step_s"] for a, b in zip(off, on)]
    on_share = statistics.median(r["time/input_dependence_s"] / r["time/step_s"] for r in on)
    print(json.dumps({
        "pairs": args.pairs, "median_step_s_off": round(base, 4),
        "median_step_s_on": round(median(on, "time/step_s"), 4),
        "on_vs_off_median": f"{100 * (median(on, 'time/step_s') / base - 1):+.1f}%",
        "median_paired_difference": f"{100 * statistics.median(differences) / base:+.1f}%",
        "median_input_dependence_s": round(median(on, "time/input_dependence_s"), 4),
        "its_share_of_the_step": f"{100 * on_share:.1f}%",
        **{f"median_{phase[5:]}_off_on": [round(median(off, phase), 4), round(median(on, phase), 4)]
           for phase in ("time/sample_s", "time/reference_s", "time/update_s")}}), flush=True)

if __name__ == "__main__":
    main()
