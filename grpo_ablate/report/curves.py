"""How a run's curve becomes the one number a contrast compares (`report --summary`: final, auc,
best, last_k), and the compute each eval point had spent (sampled + trained completion tokens;
steps for runs that logged neither; `--compute wall`: `time/step_s`).
Design: docs/curves.md (the summaries, and how auc weighs compute)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

SUMMARIES = ("final", "auc", "best", "last_k")
DEFAULT_SUMMARY = "final"
DEFAULT_K = 3
COMPUTE_COLUMNS = ("perf/sampled_tokens", "perf/completion_tokens")
WALL_COLUMN = "time/step_s"
AXES = ("tokens", "wall")


@dataclass(frozen=True)
class Curve:
    """A metric's logged points: steps, the compute spent by each, and the values (finite only)."""
    steps: np.ndarray
    compute: np.ndarray
    values: np.ndarray
    unit: str = "tokens"     # what `compute` counts: tokens, or steps where no token count was logged

    def __len__(self) -> int:
        return len(self.values)

    def upto(self, step: float) -> "Curve":
        """The points logged at or before `step` (a prefix of the run)."""
        keep = self.steps <= step
        return Curve(self.steps[keep], self.compute[keep], self.values[keep], self.unit)


def compute_axis(metrics: pd.DataFrame, axis: str = "tokens") -> tuple[np.ndarray, str]:
    """Cumulative compute at the end of each logged row (aligned with the rows), and its unit.
    `axis`: tokens (sampled + trained), or wall (the training steps' seconds, `time/step_s`:
    what a machine-bound user pays; noisy on a shared machine). Steps where it was not logged."""
    steps = metrics["step"].to_numpy(float)
    columns = {"tokens": COMPUTE_COLUMNS, "wall": (WALL_COLUMN,)}[axis]
    if all(c in metrics for c in columns):
        spent = metrics[list(columns)].to_numpy(float)
        trained = steps > 0
        if trained.any() and np.isfinite(spent[trained]).all():     # every step counted what it spent
            unit = "tokens" if axis == "tokens" else "seconds"
            return np.cumsum(np.where(trained, np.nan_to_num(spent).sum(axis=1), 0.0)), unit
    return steps, "steps"


def curve(metrics: pd.DataFrame, column: str, axis: str = "tokens") -> Curve:
    """The points where `column` was logged (finite), with their compute."""
    if column not in metrics or metrics.empty:
        return Curve(np.zeros(0), np.zeros(0), np.zeros(0))
    compute, unit = compute_axis(metrics, axis)
    values = metrics[column].to_numpy(float)
    keep = np.isfinite(values)
    return Curve(metrics["step"].to_numpy(float)[keep], compute[keep], values[keep], unit)


@dataclass(frozen=True)
class Summary:
    """One of SUMMARIES (`how`), with `k` for last_k. Called on a run's metrics, it gives the
    run's number, or None when the run logged no finite value of the metric."""
    how: str = DEFAULT_SUMMARY
    k: int = DEFAULT_K

    @classmethod
    def parse(cls, text: str, k: int | None = None) -> "Summary":
        """`final`, `auc`, `best`, `last_k` (k from `k`, default 3) or `last_<k>` (e.g. last_3).
        Raises ValueError with the allowed values."""
        name = str(text).strip().lower()
        match = re.fullmatch(r"last_(\d+)", name)
        if match:
            name, k = "last_k", int(match.group(1))
        if name not in SUMMARIES:
            raise ValueError(f"summary {text!r} is not allowed; allowed: final, auc, best, last_k (or last_<k>, "
                             "e.g. last_3)")
        k = DEFAULT_K if k is None else int(k)
        if k < 1:
            raise ValueError(f"last_k needs k >= 1 (the number of last evals averaged), got {k}")
        return cls(name, k)

    @property
    def label(self) -> str:
        return f"last_{self.k}" if self.how == "last_k" else self.how

    def describe(self) -> str:
        return {"final": "the last value a run logged",
                "auc": "the curve's compute-weighted mean over training (trapezoid over compute / compute spanned)",
                "best": "the best value a run logged",
                "last_k": f"the mean of the last {self.k} values a run logged"}[self.how]

    def __call__(self, metrics: pd.DataFrame, column: str, higher_is_better: bool = True) -> float | None:
        return self.of(curve(metrics, column), higher_is_better)

    def of(self, points: Curve, higher_is_better: bool = True) -> float | None:
        values = points.values
        if len(values) == 0:
            return None
        if self.how == "final":
            return float(values[-1])
        if self.how == "best":
            return float(values.max() if higher_is_better else values.min())
        if self.how == "last_k":
            return float(values[-self.k:].mean())
        return trapezoid_mean(points.compute, values)


def trapezoid_mean(x: np.ndarray, y: np.ndarray) -> float:
    """The mean of y over x by the trapezoid rule; one point (or no span) gives its value."""
    if len(y) == 1 or not x[-1] > x[0]:
        return float(y[-1]) if len(y) == 1 else float(np.mean(y))
    return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)) / (x[-1] - x[0]))


# --------------------------------------------------------------------------- a run's logged numbers
def final_value(metrics: pd.DataFrame, column: str) -> float | None:
    """The last value a run logged for this column."""
    if column not in metrics:
        return None
    values = metrics[column].dropna()
    return float(values.iloc[-1]) if len(values) else None


def kl_column(metrics: pd.DataFrame) -> str | None:
    """k3 when logged (the estimator the KL term usually uses), else k1."""
    for column in ("kl/k3", "kl/k1"):
        if column in metrics and metrics[column].notna().any():
            return column
    return None
