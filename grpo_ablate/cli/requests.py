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
from grpo_ablate.request_fields import argument, check_given, flags, option
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


def given(option: str, value) -> str:
    """How the user gave an option's value, for a message: `--format 'x'`, `--alpha 0.7`."""
    return f"{option} {value!r}" if isinstance(value, str) else f"{option} {value}"


@dataclass(frozen=True)
class ReportRequest:
    """`grpo-ablate report`'s options, each declared once here (request_fields.py: flag, help, default,
    what it may be): what is compared, how it is summarised, where it goes."""
    sweep_dir: Path = argument("A sweep dir (manifest.json + one run dir per variant and seed).", default=...)
    metric: str | None = option("--metric", help="Metric to compare: eval/accuracy (avg@n: the mean correctness of "
                                "the eval's samples; eval_accuracy), pass@k or maj@k of the eval, or any metrics.jsonl "
                                "column [the one the sweep fixed, else eval/accuracy].")
    eval_name: str | None = option("--eval", help="The eval protocol whose numbers are compared: a name scored after "
                                   "training by `grpo-ablate eval` (evals/<name>.jsonl), or the runs' own protocol "
                                   "[the sweep's fixed one, else the runs' own].")
    summary: str | None = option("--summary", help="How a run's curve becomes the number compared: final, auc "
                                 "(compute-weighted mean over training), best, last_k (mean of the last k evals; or "
                                 "last_<k>) [final].")
    last_k: int | None = option("--last-k", help="k of --summary last_k [3].",
                                allowed=Allowed("integer", low=1, optional=True), check=True)
    compute: str = option("--compute", help="The x axis of auc and the fits: tokens (sampled + trained) or wall "
                          "(seconds of the training steps).", default="tokens", allowed=choice("tokens", "wall"),
                          check=True)
    predict_from: float | None = option(
        "--predict-from", help="Also predict every verdict from this fraction of each run's steps (0-1), beside the "
        "measured ones (a sweep still running is predicted anyway).", check=True,
        allowed=Allowed(low=0, high=1, low_open=True, high_open=True, optional=True,
                        note="the fraction of each run's steps the fit may see"))
    fmt: str = option("--format", help="What to print: md, csv or json (all three are written).", default="md",
                      allowed=choice("md", "csv", "json"), check=True)
    out: Path | None = option("--out", help="Where report.md/.csv/.json and the PNGs go [SWEEP_DIR].")
    watch: float | None = option("--watch", help="Refresh every SECONDS (30 when none given) until every run has "
                                 "finished.", check=True,
                                 allowed=Allowed(low=0, low_open=True, optional=True,
                                                 note="seconds between two refreshes"))
    threshold: tuple[str, ...] = option("--threshold", help="Health-flag threshold NAME=VALUE (repeatable); names in "
                                        "docs/report.md, Health flags.", default=())
    lower_is_better: bool = option("--lower-is-better", help="The metric is a cost (e.g. a length).", default=False)
    effect: float | None = option("--effect", help="The smallest Δ that matters: a CI inside ±X is 'no effect', and "
                                  "the power section sizes seeds for it.")
    error_control: str = option(
        "--error-control", help="How the report's tests are adjusted together: holm (the chance of any false "
        "helps/hurts/breaks-training in the report ≤ alpha), bh (Benjamini–Hochberg: false discovery rate ≤ alpha) "
        "or none (each contrast at alpha on its own).", default="holm", allowed=choice("holm", "bh", "none"),
        check=True)
    test: str = option(
        "--test", help="How each contrast is tested: blocked (a sweep's star families, e.g. leave-one-out's all vs "
        "each drop, as one block design with seeds as blocks and moderated variances: docs/statistics.md) or paired "
        "(a paired t per contrast, its own n − 1 df; the report shows it as a sensitivity line).", default="blocked",
        allowed=choice("blocked", "paired"), check=True)
    alpha: float = option("--alpha", help="The report's error level (family-wise for holm, FDR for bh).",
                          default=0.05, allowed=Allowed(low=0, high=0.5, low_open=True, high_open=True), check=True)
    conflict_threshold: float = option("--conflict-threshold", help="Gradient cosine below which two terms conflict "
                                       "(at > half the steps).", default=-0.1,
                                       allowed=Allowed(low=-1, high=1, note="a cosine"), check=True)
    figures: bool = option("--figures/--no-figures", help="Draw the PNG figures (the slow part of a report: ~2 s); "
                           "--no-figures writes the text files only.", default=True)
    use_wandb: bool = option("--wandb", help="Also log table and figures to a W&B summary run.", default=False)
    wandb_report: bool = option("--wandb-report", help="Also build a W&B Report (online only).", default=False)

    @property
    def out_dir(self) -> Path:
        return self.out or self.sweep_dir

    def problem(self) -> str | None:
        """The first option that is not allowed, as the one line the user sees; None when all are."""
        if not self.sweep_dir.is_dir():
            return f"{self.sweep_dir}: no such directory"
        for name, flag in flags(ReportRequest).items():
            value = getattr(self, name)
            if flag.check and (problem := flag.allowed.problem(value, given(flag.shown(name), value))) is not None:
                return problem
        metric = self.metric or "eval/accuracy"
        allowed = ACCURACY_EFFECT if "accuracy" in metric or "@" in metric else POSITIVE
        if self.effect is not None and not allowed.ok(self.effect):   # null: the metric's default
            return f"--effect {self.effect} is not allowed for {metric}; {allowed.words()}"
        if self.last_k is not None and (self.summary or "").lower() != "last_k":
            return f"--last-k {self.last_k} belongs to --summary last_k (or give --summary last_{self.last_k})"
        return None
