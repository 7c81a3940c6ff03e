"""`grpo-ablate report` end to end: the files and formats it writes, the figures, W&B, --watch,
bad input, and that it never imports torch.
"""
import io
import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from conftest import REPO, cli, cli_here
from grpo_ablate.report.build import build_report
from grpo_ablate.report.write import write_report
from report_fixtures import CONTROLS, LOO, LOO_CONTRASTS, make_sweep


def test_sweep_without_controls_has_no_control_columns(tmp_path):
    out = tmp_path / "out"
    report = build_report(make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS))
    write_report(report, out, figures=False)
    md = (out / "report.md").read_text()
    for absent in ("Δ vs base", "Δ vs SFT", "Against the controls", "RL not shown", "Controls:"):
        assert absent not in md
    assert not [c for c in pd.read_csv(out / "report.csv").columns if "vs_" in c or "beats" in c]
    data = json.loads((out / "report.json").read_text())
    assert "controls" not in data and "against_controls" not in data
    assert not any("delta_vs_base" in v for v in data["variants"])



@pytest.mark.full
def test_controls_drawn_as_reference_lines(tmp_path, monkeypatch):
    # hand-computed paired intervals: the paired test (--test paired); the blocked model: test_report_blocked.py
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    legends = {}
    save = Figure.savefig

    def recording_savefig(fig, path, *args, **kwargs):   # what each PNG's legend says
        legend = fig.axes[0].get_legend()
        legends[os.path.basename(str(path))] = [t.get_text() for t in legend.get_texts()] if legend else []
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording_savefig)
    report = build_report(make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS, controls=CONTROLS), test="paired")
    out = tmp_path / "out"
    write_report(report, out)
    assert legends["curve_eval_accuracy.png"][-2:] == ["control: base (n=3)", "control: sft (n=3)"]
    # the base samples every step (reward, length); the SFT control has no RL curves
    assert "control: base (n=3)" in legends["curve_reward_mean.png"]
    assert "control: base (n=3)" in legends["curve_length_mean.png"]
    assert not [t for t in legends["curve_reward_mean.png"] if "sft" in t]
    assert not [t for t in legends["curve_policy_entropy.png"] if "control" in t]
    assert not [t for t in legends["delta.png"] if "control" in t]
    import matplotlib.image
    for png in sorted(out.glob("*.png")):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = matplotlib.image.imread(png)
        assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0
    # csv and json carry the new columns with the same numbers
    csv = pd.read_csv(out / "report.csv").set_index("variant")
    for column in ("delta_vs_base", "delta_vs_base_ci_low", "delta_vs_base_ci_high", "delta_vs_base_n",
                   "beats_base", "delta_vs_sft", "delta_vs_sft_ci_low", "delta_vs_sft_ci_high", "beats_sft"):
        assert column in csv.columns
    assert csv.loc["all", "delta_vs_sft"] == pytest.approx(-0.01)
    assert csv.loc["all", "delta_vs_sft_ci_high"] == pytest.approx(-0.01 + 4.302653 * 0.02 / math.sqrt(3), abs=1e-6)
    assert csv.loc["drop-c", "beats_sft"] and not csv.loc["drop-a", "beats_sft"]
    assert csv.loc["control-base", "kind"] == "control" and pd.isna(csv.loc["control-base", "delta_vs_base"])
    data = json.loads((out / "report.json").read_text())
    assert data["controls"] == {"base": "control-base", "sft": "control-sft"}
    variant = {v["variant"]: v for v in data["variants"]}["drop-a"]
    assert variant["delta_vs_sft"]["mean"] == pytest.approx(np.mean([-0.13, -0.10, -0.10]))
    assert {(c["variant"], c["role"]): c["outcome"] for c in data["against_controls"]}["drop-a", "sft"] == "not shown"


def test_cli_missing_dir_and_bad_input(tmp_path):
    result = cli("report", str(tmp_path / "nope"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"error: {tmp_path / 'nope'}: no such directory"
    (tmp_path / "empty").mkdir()
    make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    for args, message in [(["report", str(tmp_path / "empty")], "no manifest.json and no run dirs"),
                          (["report", str(tmp_path / "s"), "--metric", "eval/nope"], "metric 'eval/nope'"),
                          (["report", str(tmp_path / "s"), "--threshold", "patience=x"], "it must be an integer >= 1"),
                          (["report", str(tmp_path / "s"), "--threshold", "bogus=1"], "entropy_collapse_frac"),
                          (["report", str(tmp_path / "s"), "--format", "html"], "--format 'html'")]:
        result = cli_here(*args, cwd=tmp_path)   # in this process: the same command, no imports each time
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (args, result.stderr)
        assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


# --------------------------------------------------------------------------- files and formats
@pytest.mark.full
def test_cli_writes_md_csv_json_and_pngs(tmp_path):
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    (sweep / "drop-b-s1" / "metrics.jsonl").write_text("")                    # an empty run dir too
    out = tmp_path / "out"
    result = cli("report", str(sweep), "--metric", "eval_accuracy", "--out", str(out), "--format", "csv")
    assert result.returncode == 0, result.stderr
    printed = pd.read_csv(io.StringIO(result.stdout))
    assert list(printed["variant"]) == list(LOO) and printed.loc[0, "final_mean"] == pytest.approx(0.82)
    written = pd.read_csv(out / "report.csv")
    assert written.loc[0, "final_ci_high"] == pytest.approx(0.82 + 4.302653 * 0.02 / math.sqrt(3), abs=1e-5)
    data = json.loads((out / "report.json").read_text())
    assert data["metric"] == "eval/accuracy"
    assert {v["trick"]: v["verdict"] for v in data["verdicts"]}["a"] == "helps"
    md = (out / "report.md").read_text()
    assert "## Variants" in md and "`drop-b-s1`: metrics.jsonl is empty" in md
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["curve_eval_accuracy.png", "curve_kl.png", "curve_length_mean.png",
                    "curve_policy_entropy.png", "curve_reward_mean.png", "delta.png", "fits.png"]
    import matplotlib.image
    for name in pngs:
        assert f"]({name})" in md
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = matplotlib.image.imread(out / name)
        assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0
    assert not (sweep / "report.md").exists()
    result = cli("report", str(sweep), "--format", "json")                     # default out dir
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["sweep"]["wandb_group"] == "loo-2026-11-30_05-40-00"
    assert (sweep / "report.md").exists() and (sweep / "delta.png").exists()


def test_report_imports_neither_torch_nor_transformers():
    code = "import sys, grpo_ablate.report; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.stdout.split() == ["False", "False"], out.stderr


@pytest.mark.full
def test_report_command_imports_neither_torch_nor_transformers(tmp_path):
    """The whole `grpo-ablate report` path (the cli module, every report module, a report with
    its figures written) runs where only a copied sweep dir is: it never imports torch."""
    sweep = make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    code = ("import importlib, pkgutil, sys\n"
            "import grpo_ablate.report\n"
            "for m in pkgutil.iter_modules(grpo_ablate.report.__path__):\n"
            "    importlib.import_module('grpo_ablate.report.' + m.name)\n"
            "from grpo_ablate.cli import app as cli\n"
            "sys.argv = ['grpo-ablate', 'report', sys.argv[1], '--format', 'csv']\n"
            "try:\n"
            "    cli.main()\n"
            "except SystemExit as done:\n"
            "    assert not done.code, done.code\n"
            "print('imported:', 'torch' in sys.modules, 'transformers' in sys.modules, file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code, str(sweep)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines()[-1] == "imported: False False", out.stderr
    assert (sweep / "report.md").exists() and (sweep / "delta.png").exists()


# --------------------------------------------------------------------------- W&B
@pytest.mark.full
def test_wandb_report_fails_fast_offline(tmp_path):
    make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    result = cli("report", str(tmp_path / "s"), "--wandb-report", env={"WANDB_MODE": "offline"})
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --wandb-report builds a W&B Report online, but WANDB_MODE=offline"
    result = cli("report", str(tmp_path / "s"), "--wandb-report", env={"WANDB_MODE": None, "WANDB_API_KEY": None,
                                                                         "HOME": str(tmp_path)})
    assert result.returncode == 2 and "needs a W&B login" in result.stderr
    assert not (tmp_path / "s" / "report.md").exists()          # refused before anything was written


@pytest.mark.full
def test_wandb_summary_run_offline(tmp_path):
    make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    result = cli("report", str(tmp_path / "s"), "--out", str(tmp_path / "out"), "--wandb",
                 env={"WANDB_MODE": None, "WANDB_API_KEY": None, "HOME": str(tmp_path)}, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "W&B offline run" in result.stderr and "group loo-2026-11-30_05-40-00, job_type report" in result.stderr
    runs = list((tmp_path / "out" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].rglob("*.wandb"))


# --------------------------------------------------------------------------- watch
@pytest.mark.full
def test_watch_ends_when_every_run_has_finished(tmp_path):
    make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS)
    result = cli("report", str(tmp_path / "s"), "--watch")          # no SECONDS: the default, 30
    assert result.returncode == 0, result.stderr
    assert "12/12 runs finished" in result.stdout and (tmp_path / "s" / "delta.png").exists()


@pytest.mark.full
def test_watch_follows_a_running_sweep_and_stops_on_ctrl_c(tmp_path):
    sweep = make_sweep(tmp_path / "s", {"all": LOO["all"]}, seeds=(0, 1))
    status = sweep / "all-s1" / "status.json"
    status.write_text(json.dumps(dict(json.loads(status.read_text()), state="running")))
    env = {k: v for k, v in os.environ.items()}
    args = [sys.executable, "-m", "grpo_ablate.cli", "report", str(sweep), "--watch", "0.2"]

    def first_refresh(proc):
        return proc.stdout.readline()    # blocks until the first table is out

    # the last run finishes while it watches: it stops by itself, exit 0, figures drawn
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert "1/2 runs finished" in first_refresh(proc)
    status.write_text(json.dumps(dict(json.loads(status.read_text()), state="completed")))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "2/2 runs finished" in out and (sweep / "curve_eval_accuracy.png").exists()

    # Ctrl-C: exit 0, one line, no traceback; the text files hold the last refresh
    status.write_text(json.dumps(dict(json.loads(status.read_text()), state="running")))
    # Ctrl-C reaches it even where this test runs with SIGINT ignored (a background job in a
    # non-interactive shell: the child would inherit the ignore, and Python install no handler)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert "1/2 runs finished" in first_refresh(proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "Traceback" not in err and "stopped watching" in err, err
    assert "1 running@40" in (sweep / "report.md").read_text()


@pytest.mark.parametrize("kind", ["leave-one-out", "contexts with controls"])
def test_report_md_opens_with_the_verdict_table(kind, tmp_path):
    """The verdicts first. report.md's first table is the verdict table, within its first
    8 lines, with at most three lines between the title and it (the family and its error control,
    training against its untrained start, the cost of deciding the rest); the method text is below."""
    from report_sim import write_sweep
    from training_sim import write_context_sweep

    rng = np.random.default_rng(4)
    path = (write_sweep(tmp_path / "s", rng, tricks=6, seeds=5, effects={"t0": 0.8, "t1": -0.8})[0]
            if kind == "leave-one-out" else
            write_context_sweep(tmp_path / "s", rng, training={"down": -1.5, "up": 1.0}, effects={"t0": 1.0})[0])
    result = cli_here("report", path, "--no-figures", cwd=tmp_path)
    assert result.exit_code == 0, result.stdout
    md = (path / "report.md").read_text()
    lines = md.splitlines()
    first_table = next(i for i, line in enumerate(lines) if line.startswith("|"))
    assert lines[0].startswith("# Report: ") and first_table < 8
    assert lines[first_table] == "| trick | Δ (with − without) [95% CI] | adjusted p | verdict |"
    between = [line for line in lines[1:first_table] if line.strip()]
    assert len(between) <= 3 and between[0].startswith("- **Verdicts**: ")
    assert between[-1].startswith("- **") and "contrasts decided" in between[-1]
    if kind != "leave-one-out":
        assert len(between) == 3 and between[1].startswith("- **Training vs its untrained start** (2 tests, Holm")
    verdicts = json.loads((path / "report.json").read_text())["verdicts"]
    rows = lines[first_table + 2:first_table + 2 + len(verdicts)]
    assert len(rows) == len(verdicts) and lines[first_table + 2 + len(verdicts)] == ""
    for row, v in zip(rows, verdicts):
        trick, delta, p, verdict = row.strip("| ").split(" | ")
        assert trick == v["trick"] and verdict.strip("*") == v["verdict"]
        assert delta.startswith(f"{v['delta']['mean']:+.3f} [{v['delta']['low']:+.3f}, ")
        assert p == f"{v['delta']['p_adjusted']:.2g}"
    assert any(v["verdict"] in ("helps", "hurts") for v in verdicts)         # a decided row, in bold
    # the method paragraph and the sweep's facts are below the verdicts, not above them
    assert md.index("## Verdicts per trick") < md.index("## How to read this") < md.index("Metric: `eval/accuracy`")
    assert result.stdout.startswith("\n".join(lines[:first_table + 2]))      # stdout prints the same report


def test_the_first_line_names_the_familys_model_when_it_has_one(tmp_path):
    """The family may say which model its tests came from: the line above the
    verdict table carries it; a family without one reads as before."""
    from grpo_ablate.report.render import render_markdown

    report = build_report(make_sweep(tmp_path / "s", LOO, contrasts=LOO_CONTRASTS))
    assert render_markdown(report).splitlines()[2].startswith(   # the hub's own variance estimate clips here
        "- **Verdicts**: 3 tests, Holm, 5% family-wise (`all`'s star tested paired: `all`'s own variance estimate "
        "came out ≤ 0")
    report.verdicts[0]["family"]["model"] = None
    plain = render_markdown(report).splitlines()[2]
    assert plain == ("- **Verdicts**: 3 tests, Holm, 5% family-wise; compared on each run's final `eval/accuracy` "
                     "(higher is better).")
    report.verdicts[0]["family"]["model"] = "blocked model (seeds as blocks), df 19.4; variances alike"
    assert render_markdown(report).splitlines()[2] == (
        "- **Verdicts**: 3 tests, Holm, 5% family-wise (blocked model (seeds as blocks), df 19.4; variances alike); "
        "compared on each run's final `eval/accuracy` (higher is better).")
    assert "in this report ≤ 5%; blocked model (seeds as blocks)" in render_markdown(report)
