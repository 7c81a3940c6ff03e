"""The command line's options as typer reads them.

`takes(SweepArgs)` gives a command the signature built from its request's declared fields
(request_fields.py: flag, default, help), so those options are written once, on the request.
`train`'s and `report`'s options are still typer objects here, named <COMMAND>_<PARAMETER>.
"""
import inspect
import typing
from typing import List, Optional

import typer

from grpo_ablate.request_fields import flags

# train
TRAIN_RESUME = typer.Option(
    None, "--resume", help="Continue the run in this run dir from its last checkpoint.")
TRAIN_RESTART = typer.Option(False, "--restart", help="With --resume: start the run over from step 0 (one "
    "that stopped before its first checkpoint, or whose checkpoint is damaged); "
    "a finished run is never restarted.")

# tricks
TRICKS_FMT = typer.Option("table", "--format", help="table, json or md")

# report
REPORT_SWEEP_DIR = typer.Argument(..., help="A sweep dir (manifest.json + one run dir per variant and seed).")
REPORT_METRIC = typer.Option(None, "--metric", help="Metric to compare: eval/accuracy (avg@n: the mean correctness of "
    "the eval's samples; eval_accuracy), pass@k or maj@k of the eval, or any metrics.jsonl column [the one the sweep "
    "fixed, else eval/accuracy].")
REPORT_EVAL = typer.Option(None, "--eval", help="The eval protocol whose numbers are compared: a name scored after "
    "training by `grpo-ablate eval` (evals/<name>.jsonl), or the runs' own protocol [the sweep's fixed one, else "
    "the runs' own].")
REPORT_SUMMARY = typer.Option(
    None, "--summary", help="How a run's curve becomes the number compared: final, auc (compute-weighted "
    "mean over training), best, last_k (mean of the last k evals; or last_<k>) [final].")
REPORT_LAST_K = typer.Option(None, "--last-k", help="k of --summary last_k [3].")
REPORT_COMPUTE = typer.Option("tokens", "--compute", help="The x axis of auc and the fits: tokens (sampled + "
    "trained) or wall (seconds of the training steps).")
REPORT_PREDICT_FROM = typer.Option(
    None, "--predict-from", help="Also predict every verdict from this fraction of each run's steps (0-1), "
    "beside the measured ones (a sweep still running is predicted anyway).")
REPORT_FMT = typer.Option("md", "--format", help="What to print: md, csv or json (all three are written).")
REPORT_OUT = typer.Option(None, "--out", help="Where report.md/.csv/.json and the PNGs go [SWEEP_DIR].")
REPORT_WATCH = typer.Option(
    None, "--watch", help="Refresh every SECONDS (30 when none given) until every run has finished.")
REPORT_THRESHOLD = typer.Option(
    [], "--threshold", help="Health-flag threshold NAME=VALUE (repeatable); names in docs/report.md, Health flags.")
REPORT_LOWER_IS_BETTER = typer.Option(False, "--lower-is-better", help="The metric is a cost (e.g. a length).")
REPORT_EFFECT = typer.Option(None, "--effect", help="The smallest Δ that matters: a CI inside ±X is "
    "'no effect', and the power section sizes seeds for it.")
REPORT_ERROR_CONTROL = typer.Option(
    "holm", "--error-control", help="How the report's tests are adjusted together: holm (the chance of any false "
    "helps/hurts/breaks-training in the report ≤ alpha), bh (Benjamini–Hochberg: false discovery rate ≤ alpha) "
    "or none (each contrast at alpha on its own).")
REPORT_TEST = typer.Option(
    "blocked", "--test", help="How each contrast is tested: blocked (a sweep's star families, e.g. leave-one-out's "
    "all vs each drop, as one block design with seeds as blocks and moderated variances: docs/statistics.md) or "
    "paired (a paired t per contrast, its own n − 1 df; the report shows it as a sensitivity line).")
REPORT_ALPHA = typer.Option(0.05, "--alpha", help="The report's error level (family-wise for holm, FDR for bh).")
REPORT_CONFLICT_THRESHOLD = typer.Option(
    -0.1, "--conflict-threshold", help="Gradient cosine below which two terms conflict (at > half the steps).")
REPORT_FIGURES = typer.Option(True, "--figures/--no-figures", help="Draw the PNG figures (the slow part of a "
    "report: ~2 s); --no-figures writes the text files only.")
REPORT_USE_WANDB = typer.Option(False, "--wandb", help="Also log table and figures to a W&B summary run.")
REPORT_WANDB_REPORT = typer.Option(False, "--wandb-report", help="Also build a W&B Report (online only).")


def typer_parameters(request) -> list[inspect.Parameter]:
    """The typer parameters of a request class whose fields are declared with cli_fields.option:
    flag, default and help from the field, the type from its annotation (a tuple of texts is a
    repeatable option, which typer gives as a list)."""
    hints = typing.get_type_hints(request)
    params = []
    for name, flag in flags(request).items():
        hint = hints[name]
        if hint == tuple[str, ...]:
            hint = List[str]
        elif tuple[str, ...] in typing.get_args(hint):
            hint = Optional[List[str]]
        info = (typer.Argument(flag.default, help=flag.help) if flag.argument
                else typer.Option(flag.default, *flag.decls, help=flag.help))
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=hint))
    return params


def takes(request):
    """A command `def cmd(ctx, **options)` whose options are `request`'s declared fields: typer
    reads the signature built here, so the options are written once, on the request."""
    def declare(command):
        ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
        command.__signature__ = inspect.Signature([ctx, *typer_parameters(request)], return_annotation=None)
        return command
    return declare
