"""Does a run's eval peak and then fall? The test that runs before a fit is read as a ceiling.

The design, its formulas and references: docs/curves.md, "The drift test".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from grpo_ablate.report.curves import Curve
from grpo_ablate.stats.drift_null import tail

DRIFT_ALPHA = 0.05          # a monotone curve is called drifting at most this often
LATE_FRACTION = 1 / 3       # the late window: the last third of the evals after the base ...
LATE_MIN = 2                # ... and at least two of them, so the late level is an average
MIN_EVALS = 3               # after the base: at least one earlier eval and a late window of two
DEFAULT_EVAL_SIZE = 200     # when a run's config does not say (the embedded task's default)
SE_FLOOR = 1e-3             # an eval of thousands of problems still is not exact (fits.NOISE_FLOOR)


@dataclass(frozen=True)
class Drift:
    """One run's drift test: the peak of its earlier evals, the mean of its late window, the
    drop between them in eval SEs (`z`) and its p-value under the plateau null."""
    peak: float
    peak_step: float
    late: float
    window: int               # late evals averaged
    earlier: int              # evals before the window (after the base)
    se: float
    z: float
    p: float

    @property
    def drifting(self) -> bool:
        return self.p < DRIFT_ALPHA

    def describe(self) -> str:
        return (f"unstable: peaks at {self.peak:.3f} (step {self.peak_step:g}) and its last {self.window} evals "
                f"average {self.late:.3f}, a drop of {self.z:.1f} eval SEs (drift test p = {self.p:.3f})")


def binomial_se(level: float, n_eval: int | None) -> float:
    """One eval's binomial standard error at success rate `level` over n_eval problems."""
    p = min(max(float(level), 0.0), 1.0)
    n = n_eval if n_eval and n_eval > 0 else DEFAULT_EVAL_SIZE
    return max(math.sqrt(p * (1.0 - p) / n), SE_FLOOR)


def late_window(evals: int) -> int:
    """How many of a run's last evals make its late level: a third of them, at least LATE_MIN."""
    return max(LATE_MIN, math.ceil(evals * LATE_FRACTION))


def drift(points: Curve, n_eval: int | None = None) -> Drift | None:
    """The drift test of one run's curve (points from step 0, the base, which takes no part:
    the base is below any rise). None when fewer than MIN_EVALS evals follow the base."""
    if len(points) == 0 or points.steps[0] != 0 or len(points) - 1 < MIN_EVALS:
        return None
    steps, values = points.steps[1:], points.values[1:]
    k = late_window(len(values))
    earlier, late = values[:-k], values[-k:]
    i = int(np.argmax(earlier))
    peak, level = float(earlier[i]), float(late.mean())
    se = max(binomial_se(peak, n_eval), binomial_se(level, n_eval))
    z = (peak - level) / se
    return Drift(peak, float(steps[i]), level, k, len(earlier), se, z, tail(z, ((len(earlier), k),)))


def arm_drift(drifts: list[Drift | None]) -> float | None:
    """The p-value that an arm's runs, taken together, drift: Σ z over its runs against the sum
    of independent plateau nulls (each run's own shape). None without a tested run."""
    tested = [d for d in drifts if d is not None]
    if not tested:
        return None
    shapes = tuple(sorted((d.earlier, d.window) for d in tested))
    return tail(sum(d.z for d in tested), shapes)
