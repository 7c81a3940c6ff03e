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

from grpo_ablate.values import ACCURACY_EFFECT, Allowed, check_options


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

    def check(self) -> None:
        """Options that count or size something (values.py's table): ValueProblem when one is not
        allowed, before anything heavy is imported."""
        check_options(jobs=self.jobs, steps=self.steps, max_runs=self.max_runs, max_seeds=self.max_seeds,
                      effect=self.effect)


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

    def check(self) -> None:
        """values.py's table (ValueProblem), then what doctor cannot do (ValueError)."""
        check_options(jobs=self.jobs, steps=self.steps, max_runs=self.max_runs)
        if self.seeds is not None and self.seeds.strip() == "auto":
            raise ValueError("doctor asks whether any run breaks training, not whether a Δ is nonzero: there is no "
                             "contrast for --seeds auto to decide; give a seed count (--seeds 2)")


# the report's choices: option -> the values it allows
REPORT_CHOICES = {"--format": ("md", "csv", "json"), "--compute": ("tokens", "wall"),
                  "--error-control": ("holm", "bh", "none")}


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
        if self.fmt not in REPORT_CHOICES["--format"]:
            return f"--format {self.fmt!r} is not allowed; allowed: md, csv, json"
        if self.watch is not None and self.watch <= 0:
            return f"--watch {self.watch}: the refresh interval must be > 0 seconds"
        if not -1.0 <= self.conflict_threshold <= 1.0:
            return f"--conflict-threshold {self.conflict_threshold} is not allowed; a cosine lies in [-1, 1]"
        allowed = ACCURACY_EFFECT if "accuracy" in self.metric else Allowed("number", low=0, low_open=True)
        if self.effect is not None and not allowed.ok(self.effect):
            return f"--effect {self.effect} is not allowed for {self.metric}; {allowed.words()}"
        return self._summary_problem() or self._test_problem()

    def _summary_problem(self) -> str | None:
        if self.last_k is not None and self.last_k < 1:
            return f"--last-k {self.last_k} is not allowed; it must be an integer >= 1"
        if self.last_k is not None and (self.summary or "").lower() != "last_k":
            return f"--last-k {self.last_k} belongs to --summary last_k (or give --summary last_{self.last_k})"
        if self.compute not in REPORT_CHOICES["--compute"]:
            return f"--compute {self.compute!r} is not allowed; allowed: tokens, wall"
        return None

    def _test_problem(self) -> str | None:
        if self.error_control not in REPORT_CHOICES["--error-control"]:
            return f"--error-control {self.error_control!r} is not allowed; allowed: holm, bh, none"
        if not 0 < self.alpha < 0.5:
            return f"--alpha {self.alpha} is not allowed; it must lie in (0, 0.5)"
        if self.predict_from is not None and not 0 < self.predict_from < 1:
            return (f"--predict-from {self.predict_from} is not allowed; give the fraction of each run's steps, "
                    "in (0, 1)")
        return None
