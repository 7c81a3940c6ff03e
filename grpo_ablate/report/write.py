"""Writing a report next to (or away from) its sweep: report.md, report.csv, report.json, the PNGs."""
from __future__ import annotations

import json
import os
from pathlib import Path

from grpo_ablate.report.build import Report
from grpo_ablate.report.plots import plot_figures
from grpo_ablate.report.render import flat_rows, render_markdown, report_json


def write_report(report: Report, out_dir: Path, figures: bool = True) -> list[Path]:
    """report.md, report.csv, report.json (always all three) and, with figures, the PNGs."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = plot_figures(report, out_dir) if figures else None
    texts = {"report.md": render_markdown(report, drawn), "report.csv": flat_rows(report).to_csv(index=False),
             "report.json": json.dumps(report_json(report, drawn), indent=2) + "\n"}
    for name, text in texts.items():  # --watch rewrites them while someone may be reading: atomically
        tmp = out_dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out_dir / name)
    return [out_dir / name for name in texts] + [out_dir / name for _, name in drawn or []]
