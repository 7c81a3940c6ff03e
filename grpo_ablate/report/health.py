"""Health flags: what went wrong in one run, each with the step it first fired.

    diverged          the trainer said so, or a training step's loss is null (NaN/Inf)
    entropy_collapse  policy entropy far below its first value, for a while
    length_blowup     completions running into the length cap, for a while
    repetition        distinct-2 inside completions collapsing, or one text for many prompts
    kl_drift          KL above a threshold from some step to the end (a warning only)
    template_collapse the completions' dependence on their prompt (diag/input_dependence, RAGEN-2's
                      template collapse) far below its first logged value, for a while (a warning only;
                      only a run that logged it: diag.input_dependence_every > 0)
    tool_failures     most of a multi-turn run's turns get no usable reply (turns/failed_frac: a tool call
                      that does not parse, a tool that refuses or raises, a turn cut by its budget), for a
                      while (a warning only; only a run that logged it: a multi-turn task)

Pure functions of what a run logged: metrics as a frame (see `load.metrics_frame`), samples
as rows of samples.jsonl, status as status.json.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np
import pandas as pd

from grpo_ablate.errors import ReportError
from grpo_ablate.report.curves import kl_column
from grpo_ablate.allowed import POSITIVE, Allowed

# Flags that mean training broke. kl_drift is a warning only: a policy may legitimately move
# far from its start, and a variant without a KL term is free to. template_collapse too: its metric
# comes from a sub-batch of a few completions at a few steps, an estimate too noisy to call a run broken.
BREAKING_FLAGS = ("diverged", "entropy_collapse", "length_blowup", "repetition")
# tool_failures too: a policy may fail its tool calls for a while and learn to stop (the calculator's warm
# start does fail some), and a task may be hard; it says where to look, not that training broke.
WARNING_FLAGS = ("kl_drift", "template_collapse", "tool_failures")
INPUT_DEPENDENCE = "diag/input_dependence"
FAILED_TURNS = "turns/failed_frac"   # failed turns / turns of the step's episodes (train/metrics.py)
# the flags that read a metric only some runs log, and their thresholds: shown (report.md, report.json) only
# where a run logged it, so the reports of runs without it read as they did before the flag existed
OPTIONAL_FLAGS = {"template_collapse": INPUT_DEPENDENCE, "tool_failures": FAILED_TURNS}
OPTIONAL_THRESHOLDS = {"input_dependence_frac": INPUT_DEPENDENCE, "failed_turns_frac": FAILED_TURNS}


@dataclass
class HealthThresholds:
    """When a run's health flag fires. Override with `--threshold name=value`."""
    entropy_collapse_frac: float = 0.1     # policy/entropy below this fraction of its first value
    patience: int = 3                      # ... for this many consecutive logged steps (length_blowup too)
    length_cap_frac: float = 0.95          # length/mean at or above this fraction of rollout.max_new_tokens
    truncated_frac: float = 0.5            # or length/truncated_frac above this
    repetition_distinct_frac: float = 0.5  # distinct-2 inside completions below this fraction of its first value
    repetition_same_frac: float = 0.75     # or one completion given for this share of >= 3 different prompts
    kl_drift_threshold: float = 0.1        # KL above this from some step to the end (patience steps at least),
                                           # ending higher
    input_dependence_frac: float = 0.5     # diag/input_dependence below this fraction of its first logged value
                                           # for `patience` logged values in a row (template_collapse)
    failed_turns_frac: float = 0.5         # turns/failed_frac above this for `patience` steps (tool_failures)


# what each threshold may be (a fraction of a first value or of the length cap, a count of steps, a KL)
FRACTION = Allowed("number", low=0, high=1, low_open=True)   # null (not a number) is refused
THRESHOLD_RANGES = {"entropy_collapse_frac": FRACTION, "patience": Allowed("integer", low=1),
                    "length_cap_frac": FRACTION, "truncated_frac": FRACTION, "repetition_distinct_frac": FRACTION,
                    "repetition_same_frac": FRACTION, "kl_drift_threshold": POSITIVE,
                    "input_dependence_frac": FRACTION, "failed_turns_frac": FRACTION}


@dataclass
class Flag:
    name: str      # diverged | entropy_collapse | length_blowup | repetition | kl_drift | template_collapse
                   # | tool_failures
    step: int      # the step it first fired
    detail: str    # the numbers behind it


def parse_thresholds(items: list[str]) -> HealthThresholds:
    """`name=value` pairs over the defaults; bad names or values are a ReportError."""
    th = HealthThresholds()
    types = {f.name: type(getattr(th, f.name)) for f in fields(th)}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in types:
            raise ReportError(f"--threshold {item!r}: expected name=value with name one of {', '.join(types)}")
        try:
            number = types[name.strip()](value)
        except ValueError:
            number = None
        if (problem := THRESHOLD_RANGES[name.strip()].problem(number, f"--threshold {item}")) is not None:
            raise ReportError(problem)
        setattr(th, name.strip(), number)
    return th


def health_flags(metrics: pd.DataFrame, samples: list[dict], max_new_tokens: int | None,
                 thresholds: HealthThresholds | None = None, status: dict | None = None) -> list[Flag]:
    """What went wrong in one run, each with the step it first fired. Pure: metrics as read
    by `metrics_frame`, samples as rows of samples.jsonl, status as status.json (optional)."""
    th = thresholds or HealthThresholds()
    train = metrics[metrics["step"] > 0] if "step" in metrics else metrics.iloc[0:0]
    found = [diverged_flag(train, status), entropy_collapse_flag(train, th),
             length_blowup_flag(train, max_new_tokens, th), repetition_flag(samples, th), kl_drift_flag(train, th),
             template_collapse_flag(train, th), tool_failures_flag(train, th)]
    return sorted((f for f in found if f is not None), key=lambda f: f.step)


def diverged_flag(train: pd.DataFrame, status: dict | None) -> Flag | None:
    """The trainer said so, or a training step's loss is null (NaN/Inf is written as null)."""
    candidates = []
    if status and status.get("state") == "diverged":
        candidates.append((int(status.get("step") or 0), status.get("reason") or "status.json says diverged"))
    if "loss" in train and len(train):
        bad = train.loc[~np.isfinite(train["loss"].to_numpy(float)), "step"]
        if len(bad):
            candidates.append((int(bad.iloc[0]), f"loss non-finite at {len(bad)} of {len(train)} steps"))
    if not candidates:
        return None
    step, detail = min(candidates, key=lambda c: c[0])
    return Flag("diverged", step, detail)


def entropy_collapse_flag(train: pd.DataFrame, th: HealthThresholds) -> Flag | None:
    """Policy entropy far below where it started, for `patience` steps."""
    if "policy/entropy" not in train:
        return None
    entropy = train[["step", "policy/entropy"]].dropna()
    if not len(entropy) or not entropy["policy/entropy"].iloc[0] > 0:
        return None
    first = float(entropy["policy/entropy"].iloc[0])
    low = entropy["policy/entropy"] < th.entropy_collapse_frac * first
    step = first_streak(entropy["step"], low, th.patience)
    if step is None:
        return None
    value = float(entropy.loc[entropy["step"] == step, "policy/entropy"].iloc[0])
    return Flag("entropy_collapse", step, f"policy/entropy {value:.3g} < {th.entropy_collapse_frac} x its first value "
                                          f"{first:.3g} for {th.patience}+ steps")


def length_blowup_flag(train: pd.DataFrame, max_new_tokens: int | None, th: HealthThresholds) -> Flag | None:
    """Completions running into the cap (mean length near it, or many truncated), for `patience` steps."""
    at_cap = pd.Series(False, index=train.index)
    if max_new_tokens and "length/mean" in train:
        at_cap = train["length/mean"] >= th.length_cap_frac * max_new_tokens
    truncated = train["length/truncated_frac"] > th.truncated_frac if "length/truncated_frac" in train \
        else pd.Series(False, index=train.index)
    step = first_streak(train["step"], at_cap | truncated, th.patience)
    if step is None:
        return None
    row = train.loc[train["step"] == step].iloc[0]
    detail = (f"length/mean {row['length/mean']:.1f} >= {th.length_cap_frac} x max_new_tokens {max_new_tokens}"
              if at_cap[row.name] else
              f"length/truncated_frac {row['length/truncated_frac']:.2f} > {th.truncated_frac}")
    return Flag("length_blowup", step, detail + f" for {th.patience}+ steps")


def kl_drift_flag(train: pd.DataFrame, th: HealthThresholds) -> Flag | None:
    """KL above the threshold from some step to the end (`patience` steps at least), and higher at the end."""
    column = kl_column(train)
    if column is None:
        return None
    kl = train[["step", column]].dropna()
    above = (kl[column] > th.kl_drift_threshold).to_numpy()
    if not (len(above) and above[-1]):
        return None
    start = len(above) - int(np.argmin(above[::-1])) if not above.all() else 0
    first, last = float(kl[column].iloc[start]), float(kl[column].iloc[-1])
    if len(above) - start < th.patience or last < first:
        return None
    return Flag("kl_drift", int(kl["step"].iloc[start]),
                f"{column} above {th.kl_drift_threshold} from here to the end ({first:.3g} -> {last:.3g})")


def template_collapse_flag(train: pd.DataFrame, th: HealthThresholds) -> Flag | None:
    """The completions stop depending on their prompt (RAGEN-2's template collapse): diag/input_dependence
    (train/input_dependence.py) below `input_dependence_frac` of its first logged value for `patience`
    logged values in a row. Entropy may hold meanwhile (that is the case entropy_collapse cannot see): the
    detail says where policy/entropy stood, so the two read together."""
    if INPUT_DEPENDENCE not in train:
        return None
    logged = train[["step", INPUT_DEPENDENCE]].dropna()
    if not len(logged) or not logged[INPUT_DEPENDENCE].iloc[0] > 0:
        return None
    first = float(logged[INPUT_DEPENDENCE].iloc[0])
    step = first_streak(logged["step"], logged[INPUT_DEPENDENCE] < th.input_dependence_frac * first, th.patience)
    if step is None:
        return None
    value = float(logged.loc[logged["step"] == step, INPUT_DEPENDENCE].iloc[0])
    detail = (f"{INPUT_DEPENDENCE} {value:.3g} < {th.input_dependence_frac} x its first value {first:.3g} for "
              f"{th.patience}+ logged steps")
    if "policy/entropy" in train:
        entropy = train[["step", "policy/entropy"]].dropna()
        at = entropy.loc[entropy["step"] == step, "policy/entropy"]
        if len(entropy) and len(at) and entropy["policy/entropy"].iloc[0] > 0:
            share = float(at.iloc[0]) / float(entropy["policy/entropy"].iloc[0])
            detail += f"; policy/entropy at {share:.2f} x its first"
    return Flag("template_collapse", step, detail)


def tool_failures_flag(train: pd.DataFrame, th: HealthThresholds) -> Flag | None:
    """Most turns of a multi-turn run fail (turns/failed_frac > failed_turns_frac) for `patience` steps.
    The detail sets turns/mean beside it: one failed turn per episode ends it early (a cut turn), many
    are calls retried until the turn budget runs out."""
    if FAILED_TURNS not in train:
        return None
    logged = train[["step", FAILED_TURNS]].dropna()
    step = first_streak(logged["step"], logged[FAILED_TURNS] > th.failed_turns_frac, th.patience)
    if step is None:
        return None
    value = float(logged.loc[logged["step"] == step, FAILED_TURNS].iloc[0])
    detail = f"{FAILED_TURNS} {value:.2f} > {th.failed_turns_frac} for {th.patience}+ steps"
    turns = train.loc[train["step"] == step, "turns/mean"].dropna() if "turns/mean" in train else ()
    if len(turns):
        detail += f"; turns/mean {float(turns.iloc[0]):.2f}"
    return Flag("tool_failures", step, detail)


def shown_thresholds(thresholds: HealthThresholds, runs) -> dict:
    """The thresholds a report shows: every one, but those of a flag whose metric none of `runs` (each
    with a `metrics` frame) logged (OPTIONAL_THRESHOLDS)."""
    logged = {column for r in runs for column in getattr(r, "metrics", pd.DataFrame()).columns}
    return {name: value for name, value in asdict(thresholds).items()
            if name not in OPTIONAL_THRESHOLDS or OPTIONAL_THRESHOLDS[name] in logged}


def first_streak(steps: pd.Series, condition: pd.Series, patience: int) -> int | None:
    """First step of the first run of `patience` consecutive rows where condition holds."""
    streak = 0
    steps = list(steps)
    for i, hit in enumerate(condition.fillna(False).astype(bool)):
        streak = streak + 1 if hit else 0
        if streak >= max(1, patience):
            return int(steps[i - streak + 1])
    return None


# --------------------------------------------------------------------------- repetition
def distinct_2(completions: list[str]) -> float | None:
    """Mean share of distinct character bigrams inside each completion (a repeater's
    "ab ab ab ab" scores low). Characters, not tokens: no tokenizer is needed, and the
    flag compares the value with the run's own first one, so the unit cancels out."""
    scores = []
    for text in completions:
        bigrams = [text[i:i + 2] for i in range(len(text) - 1)]
        if len(bigrams) >= 2:
            scores.append(len(set(bigrams)) / len(bigrams))
    return float(np.mean(scores)) if scores else None


def repetition_flag(samples: list[dict], th: HealthThresholds) -> Flag | None:
    """distinct-2 far below the run's first sampled value, or the same text whatever the question."""
    by_step: dict[int, list[dict]] = {}
    for row in samples:
        if isinstance(row.get("step"), int) and isinstance(row.get("completion"), str):
            by_step.setdefault(row["step"], []).append(row)
    first, first_step = None, None
    for step in sorted(by_step):
        rows = by_step[step]
        value = distinct_2([r["completion"] for r in rows])
        if first is None and value is not None:
            first, first_step = value, step
        elif value is not None and first > 0 and value < th.repetition_distinct_frac * first:
            return Flag("repetition", step, f"distinct-2 inside completions {value:.2f} < "
                        f"{th.repetition_distinct_frac} x {first:.2f} (step {first_step})")
        # the same text whatever the question: only testable when the samples span >= 3 prompts
        prompts_per_text: dict[str, set] = {}
        for r in rows:
            prompts_per_text.setdefault(r["completion"], set()).add(r.get("prompt"))
        n_prompts = len({r.get("prompt") for r in rows})
        text, prompts = max(prompts_per_text.items(), key=lambda kv: len(kv[1]))
        if n_prompts >= 3 and len(prompts) >= th.repetition_same_frac * n_prompts:
            return Flag("repetition", step, f"the same completion {text[:40]!r} for {len(prompts)} of "
                        f"{n_prompts} different prompts")
    return None
