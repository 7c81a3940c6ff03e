"""Decisions per CPU-minute at several eval-set sizes, from one sweep run at the largest.

Since the eval problems are held out by construction (grpo_ablate/tasks/holdout.py), an eval set of
n problems is the first n of a larger one and nothing else in a run depends on its size. So one sweep
run with `task.eval_size=N` gives the sweep at every n <= N: each copy keeps the first n scores of
every eval in evals.jsonl, recomputes eval/accuracy from them, and is reported as the sweep would be
(`build_report`, the manifest's summary, both tests). Its cost is the run's wall time with the evals'
share (time/eval_s) scaled to n / N. Checked once, since greedy decoding batches the eval set and a
batch of other problems could round a logit differently: the default sweep's all-s5, run again at
task.eval_size=500, wrote the first 500 scores of its 2000-problem run at every eval, and the same
training metrics.

    .venv/bin/python benchmarks/eval_size.py runs/sweeps/<sweep> --sizes 200,500,1000,2000
"""
import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from grpo_ablate.report.build import build_report
from grpo_ablate.report.verdicts import UNDECIDED
from grpo_ablate.rundir.files import pack_scores, unpack_scores


def truncate_run(src: Path, dst: Path, n: int) -> float:
    """Copy a run dir keeping the first n problems of every eval; returns its cost in CPU-seconds at n."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("checkpoint", "samples.jsonl", "wandb"))
    accuracy, rows = {}, []
    for line in (src / "evals.jsonl").read_text().splitlines():
        row = json.loads(line)
        scores = unpack_scores(row)[:n]
        accuracy[row["step"]] = sum(scores) / len(scores)
        rows.append({"step": row["step"], "set": f"{row['set']}[:{n}]", **pack_scores(scores)})
    (dst / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics, eval_s = [], 0.0
    for line in (src / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "eval/accuracy" in row and row["step"] in accuracy:
            row["eval/accuracy"] = accuracy[row["step"]]
        eval_s += row.get("time/eval_s", 0.0) or 0.0
        metrics.append(row)
    (dst / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    wall = json.loads((src / "status.json").read_text()).get("wall_time_s") or 0.0
    size = len(unpack_scores(json.loads((src / "evals.jsonl").read_text().splitlines()[0])))
    return wall - eval_s + eval_s * n / size


def at_size(sweep: Path, n: int, where: Path) -> dict:
    """The sweep's report with every eval cut to its first n problems, and the sweep's cost at n."""
    copy = where / f"{sweep.name}-n{n}"
    shutil.copytree(sweep, copy, ignore=lambda d, names: [x for x in names if (Path(d) / x / "status.json").exists()])
    cost = 0.0
    for run in sweep.iterdir():
        if (run / "evals.jsonl").exists():
            cost += truncate_run(run, copy / run.name, n)
    report = build_report(copy)
    decided = sum(v["verdict"] not in UNDECIDED for v in report.verdicts)
    out = {"eval_size": n, "cpu_min": round(cost / 60, 1), "decided": decided, "contrasts": len(report.verdicts),
           "decided_paired": report.sensitivity["decided"] if report.sensitivity else None,
           "decisions_per_cpu_hour": round(60 * decided / (cost / 60), 2) if cost else None,
           "verdicts": {v["trick"]: [v["verdict"], round(v["delta"].mean, 4), v["delta"].p_adjusted]
                        for v in report.verdicts},
           "model": report.verdicts[0]["family"].get("model") if report.verdicts else None}
    shutil.rmtree(copy)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--sizes", default="200,500,1000,2000")
    args = parser.parse_args()
    where = Path(tempfile.mkdtemp(prefix="eval-size-"))
    try:
        for n in map(int, args.sizes.split(",")):
            print(json.dumps(at_size(args.sweep, n, where)), flush=True)
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
