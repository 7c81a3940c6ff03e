"""Which eval should the default sweep decide on? Greedy accuracy against avg@k at the training temperature
(T = 1) for k in {1, 4, 8, 16}, on one real sweep of the embedded default: decisions per CPU-minute,
and whether each run's curve holds (its last three evals within one SE of its best).

The sweep must have been run with `eval.keep_weights=true` and scored after training with 16 samples at
every kept step:

    grpo-ablate sweep leave-one-out --seeds 50,51,52,53,54 --dir SWEEP eval.keep_weights=true
    grpo-ablate eval SWEEP eval=sampled eval.samples=16 --name t1k16 --steps all

avg@k for k < 16 is read from the first k of the 16 samples of each problem (the samples are
independent draws given the policy, so the first k are a k-sample eval; `derive`), written beside as
evals/t1k<k>.json(l). `cost` times one eval of each protocol on the sweep's start (the embedded
default's warm start, 500 problems, one thread, as a sweep's runs run), medians of `--repeat`, all in
this process, interleaved. `table` prints per protocol: contrasts decided (the report's default: the
blocked model, Holm 5%, on last_3), the paired SD of Δ per contrast, the sweep's CPU-minutes (training
without its own greedy evals, from metrics.jsonl, plus 7 evals per run at the protocol's measured
cost), decisions per CPU-minute, and the share of runs whose curve holds.

    .venv/bin/python benchmarks/eval_protocols.py derive SWEEP
    .venv/bin/python benchmarks/eval_protocols.py cost SWEEP [--repeat 3]
    .venv/bin/python benchmarks/eval_protocols.py table SWEEP [--cost cost.json]
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

PROTOCOLS = {"greedy": None, "t1k1": 1, "t1k4": 4, "t1k8": 8, "t1k16": 16}   # name -> samples (None: the runs' own)
SOURCE = "t1k16"


def runs_of(sweep: Path) -> list[Path]:
    return [sweep / r["run_dir"] for r in json.loads((sweep / "manifest.json").read_text())["runs"]]


def derive(sweep: Path) -> None:
    """evals/t1k<k>.json(l) from the first k samples of each problem of evals/t1k16.jsonl."""
    from grpo_ablate.evals.scores import ProblemScores, read_row

    for run in runs_of(sweep):
        header = json.loads((run / "evals" / f"{SOURCE}.json").read_text())
        rows = [json.loads(line) for line in (run / "evals" / f"{SOURCE}.jsonl").read_text().splitlines()]
        for name, k in PROTOCOLS.items():
            if k is None or k == 16:
                continue
            head = {**header, "name": name,
                    "protocol": {**header["protocol"], "samples": k, "pass_k": [p for p in header["protocol"]["pass_k"]
                                                                            if p <= k], "maj_k": []},
                    "derived_from": f"the first {k} of the 16 samples of evals/{SOURCE}.jsonl"}
            (run / "evals" / f"{name}.json").write_text(json.dumps(head, indent=2, sort_keys=True) + "\n")
            cut = []
            for row in rows:
                scores = read_row(row)
                cut.append(json.dumps({**ProblemScores(scores.set, scores.correct[:, :k]).row(row["step"]),
                                       "length_mean": row.get("length_mean"),
                                       "truncated_frac": row.get("truncated_frac")}))
            (run / "evals" / f"{name}.jsonl").write_text("\n".join(cut) + "\n")


def cost(sweep: Path, repeat: int) -> dict:
    """Seconds per eval of each protocol (500 problems, one thread) on the first run's final weights: the
    eval alone (evals/score.evaluate, as a run calls it), medians of `repeat`, the protocols interleaved."""
    import torch

    from grpo_ablate.config.compose import compose
    from grpo_ablate.evals.score import evaluate
    from grpo_ablate.rescore.weights import Scorer
    from grpo_ablate.models import model_dir, stop_token_ids
    from grpo_ablate.sampling.engines import HFEngine, Rollouts
    from grpo_ablate.sampling.prompts import PromptEncoder
    from grpo_ablate.config.spec import run_spec
    from grpo_ablate.tasks import build_task
    from grpo_ablate.train.distributed import DataParallel

    torch.set_num_threads(1)
    weights = runs_of(sweep)[0] / "checkpoint"
    specs = {name: run_spec(compose(["logger=none"] + ([] if k is None else ["eval=sampled", f"eval.samples={k}"])))
             for name, k in PROTOCOLS.items()}
    spec = specs["greedy"]
    task = build_task(spec.task)
    policy, tokenizer = Scorer.policy(spec, model_dir(spec.model.group, task), weights, torch.device("cpu"))
    rollouts = Rollouts(HFEngine(policy, lean=True), tokenizer, PromptEncoder(tokenizer, task), task, DataParallel(),
                        torch.device("cpu"), eos_id=stop_token_ids(policy, tokenizer), max_new_tokens=32, seed=0,
                        rng="stream", stream=torch.Generator().manual_seed(0))
    times = {name: [] for name in PROTOCOLS}
    for _ in range(repeat):
        for name, each in specs.items():
            started = time.perf_counter()
            evaluate(policy, rollouts, task.eval_set(), each.eval, seed=0, step=30, max_new_tokens=32,
                     answer=task.answer)
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(t) for name, t in times.items()}


def holds(run_evals: dict, per_problem) -> bool | None:
    """Whether a run's last three evals are each within one SE (sd over problems / sqrt P) of its best."""
    steps = sorted(run_evals)
    if len(steps) < 4:
        return None
    values = {s: float(per_problem(run_evals[s]).mean()) for s in steps}
    best = max(steps, key=values.get)
    se = float(per_problem(run_evals[best]).std(ddof=1) / np.sqrt(run_evals[best].problems))
    return all(values[s] >= values[best] - se for s in steps[-3:])


def table(sweep: Path, cost_s: dict) -> list[dict]:
    from grpo_ablate.report.build import build_report
    from grpo_ablate.report.verdicts import UNDECIDED

    out = []
    training = 0.0
    for run in runs_of(sweep):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        training += sum(r.get("time/step_s") or 0.0 for r in rows)
    evals_per_run = 7
    for name in PROTOCOLS:
        report = build_report(sweep, eval_name=None if name == "greedy" else name, summary="last_3")
        decided = sum(v["verdict"] not in UNDECIDED for v in report.verdicts)
        sds = {v["trick"]: v["power"].get("sd") for v in report.verdicts}
        held = [holds(r.evals, lambda s: s.per_problem("avg")) for r in report.sweep.runs
                if r.state == "completed" and r.variant != "control-base"]
        cpu_min = (training + len(report.sweep.runs) * evals_per_run * cost_s[name]) / 60
        out.append({"protocol": name, "decided": decided, "contrasts": len(report.verdicts),
                    "verdicts": {v["trick"]: v["verdict"] for v in report.verdicts},
                    "sd": {k: round(v, 4) if v is not None else None for k, v in sds.items()},
                    "eval_s": round(cost_s[name], 3), "cpu_min": round(cpu_min, 1),
                    "decided_per_cpu_hour": round(60 * decided / cpu_min, 2),
                    "curves_hold": f"{sum(h is True for h in held)}/{sum(h is not None for h in held)}",
                    "exploratory": report.exploratory is not None})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("derive", "cost", "table"))
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cost", type=Path, help="cost's output (JSON) for table")
    args = parser.parse_args()
    if args.what == "derive":
        derive(args.sweep)
    elif args.what == "cost":
        print(json.dumps(cost(args.sweep, args.repeat)))
    else:
        cost_s = json.loads(args.cost.read_text())
        for row in table(args.sweep, cost_s):
            print(json.dumps(row), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
