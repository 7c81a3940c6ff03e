"""The command line's requests: `eval`'s and `report`'s options as one frozen object each, checked
before any work (the ranges declared on its fields; for the report, the allowed choices below); `sweep`
and `doctor`'s are sweep/requests.py's. app.py parses a command's options into its request and hands
it to the package that does the work: rescore/, report/. This module imports only the standard
library and light grpo_ablate modules, so a refused value costs no import of the training or report
stack (tests/test_refusals.py, benchmarks/refusals.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from grpo_ablate.allowed import POSITIVE, Allowed, choice
from grpo_ablate.request_fields import argument, check_given, option
from grpo_ablate.values import ACCURACY_EFFECT, COUNT, TEXT


@dataclass(frozen=True)
class EvalArgs:
    """`grpo-ablate eval`'s options as given, each declared once here; `args`: the overrides of the
    eval protocol and the task (evals/command.py)."""
    directory: Path | None = argument("A run dir, or a sweep dir (every completed run in it).")
    args: tuple[str, ...] = ()
    name: str | None = option("--name", help="What the results are called: evals/<name>.jsonl in each run dir, "
                              "`report --eval <name>` (default: the protocol's, e.g. sampled).", allowed=TEXT)
    steps: str = option("--steps", help="final: the start and the final checkpoint; all: also every eval step whose "
                        "weights the run kept (eval.keep_weights=true).", default="final",
                        allowed=choice("final", "all"), check=True)
    threads: int | None = option("--threads", help="Torch CPU threads (default: the run's `threads`).",
                                 allowed=COUNT, check=True)

    def check(self) -> None:
        """The declared ranges (ValueProblem), a directory, and no option mistaken for an override."""
        check_given(self)
        if self.directory is None:
            raise ValueError("give the run dir or sweep dir to score: grpo-ablate eval DIR [eval=sampled ...]")
        flag = next((a for a in self.args if a.startswith("-")), None)
        if flag is not None:
            raise ValueError(f"no such option: {flag}; see grpo-ablate eval --help")


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
    metric: str | None = None
    eval_name: str | None = None
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
        metric = self.metric or "eval/accuracy"
        allowed = ACCURACY_EFFECT if "accuracy" in metric or "@" in metric else POSITIVE
        if self.effect is not None and not allowed.ok(self.effect):   # null: the metric's default
            return f"--effect {self.effect} is not allowed for {metric}; {allowed.words()}"
        if self.last_k is not None and (self.summary or "").lower() != "last_k":
            return f"--last-k {self.last_k} belongs to --summary last_k (or give --summary last_{self.last_k})"
        return None
