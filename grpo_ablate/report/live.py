"""`grpo-ablate report --watch`: the report of a sweep that is still running, refreshed until it is done."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from grpo_ablate.report.build import Report, build_report
from grpo_ablate.report.load import FINISHED
from grpo_ablate.report.render import render_stdout
from grpo_ablate.report.write import write_report


def watch(sweep_dir: Path, every: float, out_dir: Path, fmt: str, **options) -> Report:
    """Re-render every `every` seconds until every run has finished (completed, diverged or
    failed); the text files are rewritten each time (figures are drawn by the caller once it
    returns). Ctrl-C propagates to the caller."""
    while True:
        report = build_report(sweep_dir, **options)
        if not report.finished:  # once finished, the caller writes the files, figures included
            write_report(report, out_dir, figures=False)
        done = sum(r.state in FINISHED for r in report.sweep.runs)
        if sys.stdout.isatty():
            print("\033[2J\033[H", end="")
        print(f"--- {time.strftime('%H:%M:%S')}: {done}/{len(report.sweep.runs)} runs finished ---")
        print(render_stdout(report, fmt), flush=True)
        if report.finished:
            return report
        time.sleep(every)
