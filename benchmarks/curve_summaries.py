"""Which run summary decides most, and how many evals a run needs (issue 21; docs/calibration.md).

    python benchmarks/curve_summaries.py SWEEP_DIR [--every 1,2,5,10] [--out FILE.md]

SWEEP_DIR is a finished sweep whose runs evaluated at every step (`eval.every=1`): evaluation
is greedy and draws nothing from the sampling stream, so a run's training is the same at any
eval spacing, and thinning its eval points to every e-th step gives exactly what a run with
`eval.every=e` would have logged. For each spacing and each summary (final, auc, best,
last_3) it builds the real report on the thinned copy and prints, per contrast, Δ, the paired
SD and the fixed-95% verdict, and per summary how many contrasts were decided; then the
verdicts predicted from the first half of every run against the measured ones.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_ablate.report import build_report  # noqa: E402
from grpo_ablate.report.verdicts import UNDECIDED  # noqa: E402
from grpo_ablate.report.formatting import fmt_estimate  # noqa: E402
from grpo_ablate.report.scaling import agreement  # noqa: E402

SUMMARIES = ("final", "auc", "best", "last_3")
COPIED = ("config.yaml", "status.json", "samples.jsonl", "overrides.yaml")


def thinned(sweep: Path, every: int, into: Path) -> Path:
    """A copy of the sweep's manifest and run files whose eval points are every `every` steps."""
    into.mkdir(parents=True)
    shutil.copy(sweep / "manifest.json", into / "manifest.json")
    for run in (p for p in sweep.iterdir() if (p / "metrics.jsonl").exists()):
        (into / run.name).mkdir()
        for name in COPIED:
            if (run / name).exists():
                shutil.copy(run / name, into / run.name / name)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        last = max(r["step"] for r in rows)
        for r in rows:
            if r["step"] % every and r["step"] != last:
                for key in [k for k in r if k.startswith("eval/")]:
                    del r[key]
        (into / run.name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        cfg = into / run.name / "config.yaml"
        if cfg.exists():   # the run as if it had been configured with this spacing
            cfg.write_text(cfg.read_text().replace("  every: 1\n", f"  every: {every}\n", 1))
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--every", default="1,2,5,10")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    lines = [f"Sweep: `{args.sweep_dir}`.", ""]
    with tempfile.TemporaryDirectory() as tmp:
        for every in (int(e) for e in args.every.split(",")):
            sweep = thinned(args.sweep_dir, every, Path(tmp) / f"every{every}")
            reports = {s: build_report(sweep, summary=s) for s in SUMMARIES}
            tricks = [v["trick"] for v in reports["final"].verdicts]
            lines += [f"### eval every {every} step(s)", "",
                      "| contrast | " + " | ".join(f"{s}: Δ / paired SD / verdict" for s in SUMMARIES) + " |",
                      "|---|" + "---|" * len(SUMMARIES)]
            for i, trick in enumerate(tricks):
                cells = []
                for s in SUMMARIES:
                    v = reports[s].verdicts[i]
                    sd = v["power"].get("sd")
                    cells.append(f"{v['delta'].mean:+.3f} / {sd:.3f} / {v['verdict']}" if sd is not None else "—")
                lines.append(f"| {trick} | " + " | ".join(cells) + " |")
            decided = [sum(v["verdict"] not in UNDECIDED for v in reports[s].verdicts) for s in SUMMARIES]
            lines += ["| decided | " + " | ".join(f"{d} of {len(tricks)}" for d in decided) + " |", ""]
            if every == 5 or every == int(args.every.split(",")[-1]):
                for s in SUMMARIES:
                    report = build_report(sweep, summary=s, predict_from=0.5)
                    predicted = report.predictions
                    rows = [f"{c['trick']}: {c['verdict']} (Δ {fmt_estimate(c['delta'], signed=True)}) vs "
                            f"{c.get('measured')}" for c in predicted["contrasts"]]
                    # agreement on *no evidence* is what a forecaster that never decides also scores
                    a = agreement(predicted, report.verdicts, UNDECIDED)
                    lines.append(f"- forecast from 50%, {s}, eval every {every}: decided {a['decided'][0]} of "
                                 f"{a['decided'][1]} agree, undecided {a['undecided'][0]} of {a['undecided'][1]}, "
                                 f"measured Δ covered {a['covered'][0]} of {a['covered'][1]} "
                                 f"({predicted['how']}): " + "; ".join(rows))
                lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
