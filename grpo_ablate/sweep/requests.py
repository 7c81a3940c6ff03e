"""`grpo-ablate sweep` and `doctor`'s options as one frozen object each, declared once (request_fields.py):
the typer signature, the sweep file's keys and --resume's refusals are read from their fields. Standard
library and light grpo_ablate modules only, so a refused value costs no import of the training stack."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpo_ablate.allowed import Allowed
from grpo_ablate.request_fields import argument, check_given, flags, option
from grpo_ablate.sweep.modes import MODES
from grpo_ablate.values import ACCURACY_EFFECT, ANY, COUNT, TEXT, TEXTS


@dataclass(frozen=True)
class SweepArgs:
    """`grpo-ablate sweep`'s options as given (None: not given), each declared once here
    (request_fields.py: flag, help, range, sweep-file key, what --resume does with it); `args`: the
    extra arguments (overrides of every run, hydra.* launcher settings, a sweep file's path)."""
    mode: str | None = argument(" | ".join((*MODES, "file PATH")), allowed=TEXT, file=True)
    args: tuple[str, ...] = ()
    tricks: str | None = option("--tricks", help="Named tricks, comma separated (default for leave-one-out: the "
                                "seed review's recommended set, dynamic_sampling, no_std).", allowed=TEXTS, file=True)
    trick: str | None = option("--trick", help="conflict: the new trick (any named trick).")
    reward: str | None = option("--reward", help="conflict: the new reward term, a named trick whose option adds a "
                                "term to the reward (e.g. length_penalty, overlong_punish; a wrong one is refused "
                                "with the list).")
    base: str | None = option("--base", help="Preset the tricks are added to (grpo, dapo, ...).", allowed=TEXT,
                              file=True)
    seeds: str | None = option("--seeds", help="5 = seeds 0..4; or a list: 0,5,9; or auto: 3, then one more per look "
                               "until each contrast is decided (default 5).", allowed=Allowed("seeds", optional=True),
                               file=True)
    max_seeds: int | None = option("--max-seeds", help="--seeds auto: at most this many seeds (default 8).",
                                   allowed=COUNT, check=True, file=True, resume="kept")
    budget: str | None = option("--budget", help="--seeds auto: start no look past this wall time (90m, 2h).",
                                allowed=TEXT, file=True, resume="kept")
    effect: float | None = option("--effect", help="--seeds auto: the smallest Δ that matters; a contrast whose "
                                  "repeated 95% interval lies inside ±X stops as 'no effect >= X'.",
                                  allowed=ACCURACY_EFFECT, check=True, file=True)
    metric: str | None = option("--metric", help="The eval metric the sweep decides on, fixed in its manifest before "
                                "the first run: eval/accuracy (avg@n of the eval's n samples; greedy accuracy for "
                                "one), pass@k or maj@k (k <= n) [eval/accuracy].", allowed=TEXT, file=True)
    eval: str | None = option("--eval", help="Decide on an eval protocol scored after training instead of the runs' "
                              "own (an option of conf/eval/, e.g. sampled): fixed in the manifest; after the runs, "
                              "`grpo-ablate eval DIR eval=<it>` scores them.", allowed=TEXT, file=True)
    summary: str | None = option("--summary", help="What the sweep decides on, fixed in its manifest before the first "
                                 "run (and what --seeds auto looks at): final, auc, best, last_k or last_<k>, as "
                                 "report --summary [last_3; final with --eval].", allowed=TEXT, file=True)
    launcher: str | None = option("--launcher", help="basic | joblib | submitit_local | submitit_slurm | ray "
                                  "(default joblib).", allowed=TEXT, file=True, resume="kept")
    jobs: int | None = option("--jobs", help="Runs at a time (default: one per core).", allowed=COUNT, check=True,
                              resume="kept")
    family: tuple[str, ...] | None = option("--family", help="factorial over a config group's options (adv) or a "
                                            "key's values (task.level, key=a,b); repeatable.")
    across: tuple[str, ...] | None = option("--across", help="Repeat the whole matrix in contexts: KEY=v1,v2 "
                                            "(task.level=easy,hard, reward.wrong=0,-1, model=tiny,tiny_aligned); "
                                            "repeatable: every combination.")
    max_runs: int | None = option("--max-runs", help="Refuse sweeps with more runs (default 128).", allowed=COUNT,
                                  check=True, file=True)
    steps: int | None = option("--steps", help="Training steps of every run.", allowed=COUNT, check=True, file=True)
    name: str | None = option("--name", help="Sweep name (W&B group prefix, dir name).", allowed=TEXT, file=True)
    out: Path | None = option("--dir", help="Sweep dir (default runs/sweeps/<name>-<time>).")
    controls: bool | None = option("--controls/--no-controls", help="Add the no-RL controls (untrained base, "
                                   "supervised run); default: on for the embedded model.",
                                   allowed=Allowed("bool", optional=True), file=True)
    control_budget: str | None = option("--control-budget", help="The SFT control's budget: tokens (B x G solutions "
                                        "a step) or wall (the treatments' median training time; runs after them). "
                                        "Default tokens.", allowed=Allowed("choice", choices=("tokens", "wall"),
                                                                           optional=True), check=True)
    dry_run: bool = option("--dry-run", help="Print the matrix, write nothing.", default=False)
    allow_inert: bool = option("--allow-inert", help="Run tricks under test that cannot act with these settings "
                               "(refused by default; see `grpo-ablate tricks`).", default=False, resume="ignored")
    resume_dir: Path | None = option("--resume", help="Continue this sweep dir.", resume="kept")
    rerun: str | None = option("--rerun", help="--resume: start these runs over, comma separated (e.g. all-s0; their "
                               "old dirs are kept aside).", resume="kept")
    placebos: int | None = option("--placebos", help="aa: placebo variants beside the reference, each differing from "
                                  "it only by its own sampling stream (default 6).", allowed=COUNT, check=True,
                                  file=True)
    determinism: bool = option("--determinism", help="aa: instead of the sweep, train its reference's first seed twice "
                               "and check that metrics.jsonl is bit-identical (timings aside); exit 1 naming the first "
                               "metric and step that differ.", default=False)

    def check(self) -> None:
        """Options that count or size something: ValueProblem when one is not allowed, before
        anything heavy is imported."""
        check_given(self)


# Every key of a sweep file: the options a file may set too (declared above), then the keys only
# a file has (a new file-only key is one line here).
SWEEP_FILE_FIELDS = {name: flag.allowed for name, flag in flags(SweepArgs).items() if flag.file} | {
    "description": ANY, "overrides": TEXTS, "families": Allowed("families", optional=True),
    "variants": Allowed("mapping", optional=True),
    "contexts": ANY,   # a list of {name, overrides} or a mapping: contexts.file_contexts checks the shape
    "expected_pairs": TEXTS,   # pair rules (pair_rules.py) the file asks about: silent for its sweep
}


@dataclass(frozen=True)
class DoctorArgs:
    """`grpo-ablate doctor`'s options as given (None: not given), each declared once here;
    `args`: the extra arguments."""
    args: tuple[str, ...] = ()
    tricks: str | None = option("--tricks", help="Candidate tricks, comma separated (default: the seed review's "
                                "recommended set on --base grpo).")
    base: str | None = option("--base", help="Preset the tricks are added to (grpo, dapo, ...).")
    steps: int | None = option("--steps", help="Training steps of every run (default 30: short).", allowed=COUNT,
                               check=True)
    seeds: str | None = option("--seeds", help="Seeds per set: 1 (default), 2 = 0,1, or 0,5.")
    launcher: str | None = option("--launcher", help="basic | joblib | submitit_local | ... (default joblib).",
                                  resume="kept")
    jobs: int | None = option("--jobs", help="Runs at a time (default: one per core).", allowed=COUNT, check=True,
                              resume="kept")
    max_runs: int | None = option("--max-runs", help="Stop the search before more runs (default 32).",
                                  allowed=COUNT, check=True)
    threshold: tuple[str, ...] = option("--threshold", help="Health-flag threshold NAME=VALUE (repeatable).",
                                        default=())
    out: Path | None = option("--dir", help="Doctor dir (default runs/doctor/<time>).")
    dry_run: bool = option("--dry-run", help="Print the first stages, write nothing.", default=False)
    allow_inert: bool = option("--allow-inert", help="Search tricks that cannot act with these settings (refused by "
                               "default).", default=False, resume="ignored")
    resume_dir: Path | None = option("--resume", help="Continue this doctor dir.", resume="kept")
    lint: Path | None = option("--lint", help="List the pair rules (settings that change what a trick means) that "
                               "hold in this sweep file's runs; nothing is run. Exit 1 when one holds that the file "
                               "does not expect (expected_pairs).", resume="ignored")

    def check(self) -> None:
        """The declared ranges (ValueProblem), then what doctor cannot do (ValueError)."""
        check_given(self)
        if self.seeds is not None and self.seeds.strip() == "auto":
            raise ValueError("doctor asks whether any run breaks training, not whether a Δ is nonzero: there is no "
                             "contrast for --seeds auto to decide; give a seed count (--seeds 2)")
