"""Statistics over seeds: means and differences of means with their 95% t-intervals.

A run's number is the last value it logged (`final_value`) or another summary of its curve (curves.py);
a variant's is the mean over its completed runs (`mean_ci`); a trick's effect is
Δ = mean(with) − mean(without) (`delta_ci`), paired by seed when both sides have the same
seeds, otherwise Welch's interval. The Student-t quantile is scipy's (`t_quantile`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats


@dataclass
class Estimate:
    """A mean (or a difference of means) with its 95% interval; low/high None without one."""
    mean: float | None = None
    low: float | None = None
    high: float | None = None
    n: int = 0
    basis: str = "no data"

    @property
    def has_ci(self) -> bool:
        return self.low is not None and self.high is not None


# --------------------------------------------------------------------------- the t distribution
def t_quantile(p: float, df: float) -> float:
    """Student-t quantile for p in (0, 1) and any df > 0 (Welch's df is fractional): scipy's, the
    same source report/sequential.py's boundaries and power use."""
    return float(stats.t.ppf(p, df))


# --------------------------------------------------------------------------- intervals
def mean_ci(values, level: float = 0.95) -> Estimate:
    """Mean with a t-interval over seeds; one value gives the mean and no interval."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if len(x) == 0:
        return Estimate()
    if len(x) == 1:
        return Estimate(float(x[0]), None, None, 1, "n=1, no CI")
    half = t_quantile(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return Estimate(float(x.mean()), float(x.mean() - half), float(x.mean() + half), len(x), f"t-interval, n={len(x)}")


def delta_ci(treated: dict, reference: dict, level: float = 0.95) -> Estimate:
    """Δ = mean(treated) − mean(reference), values keyed by seed: paired over seeds when both
    sides have the same seeds, otherwise Welch's interval (each side needs n >= 2)."""
    treated = {k: v for k, v in treated.items() if v is not None and math.isfinite(v)}
    reference = {k: v for k, v in reference.items() if v is not None and math.isfinite(v)}
    if not treated or not reference:
        return Estimate()
    if treated.keys() == reference.keys():
        seeds = sorted(treated, key=str)
        est = mean_ci([treated[s] - reference[s] for s in seeds], level)
        est.basis = f"paired over seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
        return est
    a, b = np.array(list(treated.values())), np.array(list(reference.values()))
    diff = float(a.mean() - b.mean())
    basis = f"Welch, n={len(a)} vs {len(b)} (seeds differ)"
    if len(a) < 2 or len(b) < 2:
        return Estimate(diff, None, None, min(len(a), len(b)), basis + ", no CI")
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0.0:
        return Estimate(diff, diff, diff, min(len(a), len(b)), basis)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(0.5 + level / 2, df) * se
    return Estimate(diff, diff - half, diff + half, min(len(a), len(b)), basis)


def finite_mean(values) -> float | None:
    """The mean of the finite values, None when there is none (no interval: a table cell)."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(values)) if values else None


# --------------------------------------------------------------------------- one run's numbers
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
