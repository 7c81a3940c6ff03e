"""The command line's requests: each command's options as one frozen object, checked before any work.

cli.py parses a command's options into its request (`SweepArgs`, `DoctorArgs`, `ReportRequest`),
checks it against values.py's table (and, for the report, the allowed choices below) and
hands it to the package that does the work: sweep/command.py, sweep/doctor.py, report/. This
module imports only the standard library and values.py, so a refused value costs no import of
the training or report stack (tests/test_refusals.py, benchmarks/refusals.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpo_ablate.allowed import POSITIVE, Allowed, choice
from grpo_ablate.values import ACCURACY_EFFECT, check_options


@dataclass(frozen=True)
class SweepArgs:
    """`grpo-ablate sweep`'s options as given (None: not given); `args`: the extra arguments
    (overrides of every run, hydra.* launcher settings, a sweep file's path)."""
    mode: str | None = None
    args: tuple[str, ...] = ()
    tricks: str | None = None
    trick: str | None = None
    reward: str | None = None
    base: str | None = None
    seeds: str | None = None
    max_seeds: int | None = None
    budget: str | None = None
    effect: float | None = None
    summary: str | None = None
    launcher: str | None = None
    jobs: int | None = None
    family: tuple[str, ...] | None = None
    across: tuple[str, ...] | None = None
    max_runs: int | None = None
    steps: int | None = None
    name: str | None = None
    out: Path | None = None
    controls: bool | None = None
    control_budget: str | None = None
    dry_run: bool = False
    allow_inert: bool = False
    resume_dir: Path | None = None
    rerun: str | None = None
    placebos: int | None = None
    determinism: bool = False

    def check(self) -> None:
        """Options that count or size something (values.py's table): ValueProblem when one is not
        allowed, before anything heavy is imported."""
        check_options(jobs=self.jobs, steps=self.steps, max_runs=self.max_runs, max_seeds=self.max_seeds,
                      effect=self.effect, placebos=self.placebos)


@dataclass(frozen=True)
class DoctorArgs:
    """`grpo-ablate doctor`'s options as given (None: not given); `args`: the extra arguments."""
    args: tuple[str, ...] = ()
    tricks: str | None = None
    base: str | None = None
    steps: int | None = None
    seeds: str | None = None
    launcher: str | None = None
    jobs: int | None = None
    max_runs: int | None = None
    threshold: tuple[str, ...] = ()
    out: Path | None = None
    dry_run: bool = False
    allow_inert: bool = False
    resume_dir: Path | None = None
    lint: Path | None = None

    def check(self) -> None:
        """values.py's table (ValueProblem), then what doctor cannot do (ValueError)."""
        check_options(jobs=self.jobs, steps=self.steps, max_runs=self.max_runs)
        if self.seeds is not None and self.seeds.strip() == "auto":
            raise ValueError("doctor asks whether any run breaks training, not whether a Δ is nonzero: there is no "
                             "contrast for --seeds auto to decide; give a seed count (--seeds 2)")


# the report's choices: option -> the values it allows
# The report's options with a fixed range: attribute -> (the option, what it may be).
REPORT_OPTIONS = {
    "fmt": ("--format", choice("md", "csv", "json")),
    "watch": ("--watch", Allowed(low=0, low_open=True, optional=True, note="seconds between two refreshes")),
    "conflict_threshold": ("--conflict-threshold", Allowed(low=-1, high=1, note="a cosine")),
    "last_k": ("--last-k", Allowed("integer", low=1, optional=True)),
    "compute": ("--compute", choice("tokens", "wall")),
    "error_control": ("--error-control", choice("holm", "bh", "none")),
    "test": ("--test", choice("blocked", "paired")),
    "alpha": ("--alpha", Allowed(low=0, high=0.5, low_open=True, high_open=True)),
    "predict_from": ("--predict-from", Allowed(low=0, high=1, low_open=True, high_open=True, optional=True,
                                               note="the fraction of each run's steps the fit may see")),
}


def given(option: str, value) -> str:
    """How the user gave an option's value, for a message: `--format 'x'`, `--alpha 0.7`."""
    return f"{option} {value!r}" if isinstance(value, str) else f"{option} {value}"


@dataclass(frozen=True)
class ReportRequest:
    """`grpo-ablate report`'s options: what is compared, how it is summarised, where it goes."""
    sweep_dir: Path
    metric: str = "eval/accuracy"
    summary: str | None = None
    last_k: int | None = None
    compute: str = "tokens"
    predict_from: float | None = None
    fmt: str = "md"
    out: Path | None = None
    watch: float | None = None
    threshold: tuple[str, ...] = ()
    lower_is_better: bool = False
    effect: float | None = None
    error_control: str = "holm"
    test: str = "blocked"
    alpha: float = 0.05
    conflict_threshold: float = -0.1
    figures: bool = True
    use_wandb: bool = False
    wandb_report: bool = False

    @property
    def out_dir(self) -> Path:
        return self.out or self.sweep_dir

    def problem(self) -> str | None:
        """The first option that is not allowed, as the one line the user sees; None when all are."""
        if not self.sweep_dir.is_dir():
            return f"{self.sweep_dir}: no such directory"
        for attribute, (name, allowed) in REPORT_OPTIONS.items():
            value = getattr(self, attribute)
            if (problem := allowed.problem(value, given(name, value))) is not None:
                return problem
        allowed = ACCURACY_EFFECT if "accuracy" in self.metric else POSITIVE
        if self.effect is not None and not allowed.ok(self.effect):   # null: the metric's default
            return f"--effect {self.effect} is not allowed for {self.metric}; {allowed.words()}"
        if self.last_k is not None and (self.summary or "").lower() != "last_k":
            return f"--last-k {self.last_k} belongs to --summary last_k (or give --summary last_{self.last_k})"
        return None
