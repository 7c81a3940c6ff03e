"""Sampled evals through the report's real path: simulated leave-one-out sweeps (six tricks, five seeds,
a base control) whose evals draw 8 samples per problem with the arms' draws shared at each seed and
step, as the eval's are (tests/report_sim.py, `simulate_sampled`), written to disk as the trainer and
the sweep write them and read by `build_report` (what `grpo-ablate report` runs), decided on the final
eval, Holm at 5%.

- null: no trick has an effect. Per report: does it name any trick (helps/hurts) on avg@8, on pass@8,
  on avg@1 (the first sample alone: one sample per problem at the same temperature)? Does the boundary
  family (each arm's pass@8 against the base's, paired, Holm over the 7 arms) name any arm narrows /
  widens, where the base's shift makes its expected pass@8 equal an arm's (`null_base_shift`)?
- power: one trick with a true effect (+0.33 on the logit scale) among six: how often each metric calls it.

Prints one JSON line per scenario with each rate and its Monte-Carlo SE; docs/evals.md quotes them.

    .venv/bin/python benchmarks/sampled_eval_sim.py [--sweeps 1000] [--problems 200] [--scenario null|power]
        [--seed 0]      (two processes with other --seed values split the work; their counts add up)
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
from report_sim import null_base_shift, write_sampled_sweep  # noqa: E402

from grpo_ablate.report.build import build_report  # noqa: E402

DECIDED = ("helps", "hurts")
METRICS = ("avg@8", "pass@8", "avg@1")
POWER_EFFECT = 0.33


def share(hits: int, n: int) -> dict:
    p = hits / n
    return {"rate": round(p, 4), "mc_se": round(math.sqrt(max(p * (1 - p), 1e-12) / n), 4), "n": n}


def first_sample(path: Path) -> Path:
    """The same sweep with each eval cut to its first sample (avg@1): a copy whose rows hold one column."""
    from grpo_ablate.evals.scores import read_row

    copy = path.with_name(path.name + "-k1")
    shutil.copytree(path, copy)
    for rows in copy.glob("*/evals.jsonl"):
        out = []
        for line in rows.read_text().splitlines():
            row = json.loads(line)
            scores = read_row(row)
            cut = type(scores)(scores.set, scores.correct[:, :1]).row(row["step"])
            out.append(json.dumps(cut))
        rows.write_text("\n".join(out) + "\n")
        metrics = rows.with_name("metrics.jsonl")
        lines = [json.loads(x) for x in metrics.read_text().splitlines()]
        by_step = {json.loads(x)["step"]: read_row(json.loads(x)).value("avg") for x in out}
        for r in lines:
            if r["step"] in by_step:
                r["eval/accuracy"] = by_step[r["step"]]
        metrics.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return copy


def run(name: str, sweeps: int, problems: int, effect: float, seed: int = 0) -> dict:
    rng = np.random.default_rng([2026 + int(effect * 100), seed])
    shift = null_base_shift(np.random.default_rng(0))
    named = {m: 0 for m in METRICS}
    boundary = 0
    root = Path(tempfile.mkdtemp(prefix="sampled-sim-"))
    try:
        for i in range(sweeps):
            path, _ = write_sampled_sweep(root / f"s{i}", rng, problems=problems, base_shift=shift,
                                          effects={"t0": effect} if effect else None)
            for metric in METRICS:
                where = first_sample(path) if metric == "avg@1" else path
                report = build_report(where, metric="eval/accuracy" if metric == "avg@1" else metric, summary="final")
                if effect:
                    named[metric] += report.verdicts[0]["verdict"] == "helps"
                else:
                    named[metric] += any(v["verdict"] in DECIDED for v in report.verdicts)
                if metric == "pass@8":
                    boundary += any(a["verdict"] in ("narrows", "widens") for a in report.boundary["arms"])
            shutil.rmtree(root / f"s{i}")
            shutil.rmtree(root / f"s{i}-k1", ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = {"scenario": name, "sweeps": sweeps, "problems": problems, **{m: share(n, sweeps) for m, n in named.items()}}
    if not effect:
        out["boundary"] = share(boundary, sweeps)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=1000)
    parser.add_argument("--problems", type=int, default=200)
    parser.add_argument("--scenario", choices=("null", "power", "both"), default="both")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.scenario in ("null", "both"):
        print(json.dumps(run("null", args.sweeps, args.problems, 0.0, args.seed)), flush=True)
    if args.scenario in ("power", "both"):
        print(json.dumps(run(f"power, one effect of +{POWER_EFFECT}", args.sweeps, args.problems, POWER_EFFECT,
                             args.seed)), flush=True)


if __name__ == "__main__":
    main()
