"""Compute–performance fits: does a trick raise the ceiling, or only get there faster?

The design, its formulas and references: docs/curves.md, "The sigmoid fit".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from grpo_ablate.report.curves import Curve
from grpo_ablate.report.drift import Drift, drift

C_MID_POINTS = 100
B_GRID = np.geomspace(0.05, 20.0, 60)
B_BOUNDS = (0.01, 100.0)
CEILING_TOLERANCE = 0.02     # ScaleRL: A within ±0.02 (their seed spread) counts as equal
MIN_POINTS = 3               # points after the base: a three-parameter curve needs at least that many
NOISE_FLOOR = 1e-3           # an eval of thousands of problems still is not exact


@dataclass
class Fit:
    """One fitted curve. `ok` False: `why` says what makes it untrustworthy (A, B may still be set)."""
    R0: float | None = None
    A: float | None = None
    B: float | None = None
    C_mid: float | None = None
    rmse: float | None = None
    n: int = 0                 # points fitted (after the base)
    c_max: float | None = None
    noise: float | None = None
    ok: bool = False
    why: str | None = None
    c_first: float | None = None   # the compute of the first eval after the base
    drift: Drift | None = None     # the drift test (report/drift.py), run before A is read
    unstable: bool = False         # excluded because the run peaks and falls (`why` says so)

    @property
    def excluded(self) -> str | None:
        """Why the fit is not used as a ceiling: `drifting` (the run peaks and falls: unstable),
        `poor fit` (any other reason in `why`), None when it is used."""
        if self.ok:
            return None
        return "drifting" if self.unstable else "poor fit"

    @property
    def B_identified(self) -> bool:
        """Whether the data pin B (and C_mid) down: the midpoint lies at or after the first eval.
        When the whole gain came before it, any steep enough curve fits; A is still measured."""
        return self.ok and self.C_mid is not None and self.c_first is not None and self.C_mid >= self.c_first

    def at(self, compute) -> np.ndarray:
        return sigmoid(np.asarray(compute, float), self.R0, self.A, self.B, self.C_mid)


def sigmoid(C, R0: float, A: float, B: float, C_mid: float) -> np.ndarray:
    """R_0 + (A − R_0) / (1 + (C_mid / C)^B); at C = 0 the curve is R_0."""
    C = np.asarray(C, float)
    with np.errstate(divide="ignore", over="ignore"):
        return R0 + (A - R0) / (1.0 + (C_mid / C) ** B)


def eval_noise(values: np.ndarray, n_eval: int | None) -> float:
    """The binomial standard error of one eval of n_eval problems at the curve's mean level."""
    p = float(np.clip(np.mean(values), 0.0, 1.0)) if len(values) else 0.5
    n = n_eval if n_eval and n_eval > 0 else 200
    return max(math.sqrt(p * (1.0 - p) / n), NOISE_FLOOR)


def fit(points: Curve, n_eval: int | None = None, skip: float = 0.0, A: float | None = None) -> Fit:
    """The curve through `points` (which start at step 0, the base). With `A` given, A is held
    there and only B and C_mid are fitted (the shared-A refit that compares efficiencies)."""
    if len(points) == 0 or points.steps[0] != 0:
        return Fit(why="no base eval (step 0) to anchor R_0")
    R0 = float(points.values[0])
    C, R = points.compute[1:], points.values[1:]
    c_max = float(C.max()) if len(C) else 0.0
    keep = C > skip * c_max
    C, R = C[keep], R[keep]
    noise = eval_noise(points.values, n_eval)
    tested = drift(points, n_eval) if A is None else None     # the shared-A refit reads no ceiling
    base = Fit(R0=R0, n=len(R), c_max=c_max, noise=noise, drift=tested)
    if len(R) < MIN_POINTS or not c_max > 0:
        base.why = f"{len(R)} point(s) after the base: too few to fit (at least {MIN_POINTS})"
        return base
    if A is None and np.max(np.abs(R - R0)) < 2 * noise:
        base.why = f"flat: no eval moved more than 2 eval SEs ({2 * noise:.3f}) from the base"
        return unstable(base, tested)
    A_hat, B_hat, C_mid_hat, sse = _grid(C, R, R0, c_max, A)
    A_hat, B_hat, C_mid_hat, sse = _refine(C, R, R0, c_max, A_hat, B_hat, C_mid_hat, sse, fixed_A=A is not None)
    result = Fit(R0, A_hat, B_hat, C_mid_hat, math.sqrt(sse / len(R)), len(R), c_max, noise, True, None,
                 float(C.min()), tested)
    if result.rmse > 2 * noise:
        result.ok, result.why = False, (f"not sigmoid-shaped (rises and falls?): RMSE {result.rmse:.3f} > 2 eval "
                                        f"SEs ({2 * noise:.3f})")
    elif A is None and A_hat < R0:
        result.ok, result.why = False, f"falling: A {A_hat:.3f} below the base {R0:.3f}"
    elif A is None and A_hat >= 1.0 - 1e-6 and R.max() < 1.0 - 2 * noise:
        result.ok, result.why = False, ("the ceiling is pinned at 1, above every eval: the curve has not bent yet, "
                                        "so A is an extrapolation")
    elif C_mid_hat > c_max:
        result.ok, result.why = False, ("the midpoint lies beyond the compute measured: the curve has not bent "
                                        "yet, so A is an extrapolation")
    return result if result.why and result.why.startswith("falling") else unstable(result, tested)


def unstable(result: Fit, tested: Drift | None) -> Fit:
    """The fit of a run that peaks and falls: not ok, whatever else it is — A would read the drift
    as a lower ceiling. (A run that only falls, below its base, stays *falling*: it never peaked.)"""
    if tested is not None and tested.drifting:
        result.ok, result.why, result.unstable = False, tested.describe(), True
    return result


def _c_mid_grid(C: np.ndarray, c_max: float) -> np.ndarray:
    low = float(C[C > 0].min()) if np.any(C > 0) else c_max
    return np.geomspace(low / 10.0, c_max * 10.0, C_MID_POINTS)


def _grid(C, R, R0, c_max, A_fixed) -> tuple[float, float, float, float]:
    """The best (A, B, C_mid) on the grid and its sum of squared residuals. For given (C_mid, B)
    the curve is linear in A, so each cell's A is its exact least-squares value (clipped to
    [0, 1]): the same search as the paper's grid over A, without its 0.005 steps."""
    c_mids = _c_mid_grid(C, c_max)
    # shape [C_mid, B, points]: the fraction of the gain A − R_0 reached at each point
    frac = 1.0 / (1.0 + (c_mids[:, None, None] / C[None, None, :]) ** B_GRID[None, :, None])
    gain = R - R0
    if A_fixed is not None:
        a = np.full(frac.shape[:2], float(A_fixed))
    else:
        a = R0 + (frac * gain).sum(axis=2) / np.maximum((frac ** 2).sum(axis=2), 1e-300)
        a = np.clip(a, 0.0, 1.0)
    sse = (((a - R0)[:, :, None] * frac - gain) ** 2).sum(axis=2)
    i, j = np.unravel_index(int(np.argmin(sse)), sse.shape)
    return float(a[i, j]), float(B_GRID[j]), float(c_mids[i]), float(sse[i, j])


def _refine(C, R, R0, c_max, A, B, C_mid, sse, fixed_A: bool) -> tuple[float, float, float, float]:
    """scipy's least_squares from the grid's best cell (log B and log C_mid, so both stay > 0)."""
    c_mids = _c_mid_grid(C, c_max)
    lo_c, hi_c = math.log(c_mids[0] / 10), math.log(c_mids[-1] * 10)
    if fixed_A:
        residual = lambda p: sigmoid(C, R0, A, math.exp(p[0]), math.exp(p[1])) - R
        x0, lower, upper = [math.log(B), math.log(C_mid)], [math.log(B_BOUNDS[0]), lo_c], [math.log(B_BOUNDS[1]), hi_c]
    else:
        residual = lambda p: sigmoid(C, R0, p[0], math.exp(p[1]), math.exp(p[2])) - R
        x0 = [A, math.log(B), math.log(C_mid)]
        lower, upper = [0.0, math.log(B_BOUNDS[0]), lo_c], [1.0, math.log(B_BOUNDS[1]), hi_c]
    x0 = np.clip(x0, np.nextafter(lower, np.inf), np.nextafter(upper, -np.inf))
    try:
        out = least_squares(residual, x0, bounds=(lower, upper), xtol=XTOL)
    except (ValueError, FloatingPointError):
        return A, B, C_mid, sse
    refined = float(np.sum(out.fun ** 2))
    if not refined <= sse:
        return A, B, C_mid, sse
    p = out.x
    return (A, math.exp(p[0]), math.exp(p[1]), refined) if fixed_A else (float(p[0]), math.exp(p[1]),
                                                                          math.exp(p[2]), refined)


# least_squares' default, named: it stops once a step moves the parameters (A, log B, log C_mid) by
# less than XTOL * (XTOL + |x|), so where it stops is known to about that, not to the last bit (its
# path runs through BLAS kernels that differ by CPU); tests/test_golden.py derives its tolerance from it.
XTOL = 1e-8


def pooled(curves: list[Curve]) -> Curve:
    """Several seeds' points as one curve (the base: their mean) for a variant's pooled fit."""
    curves = [c for c in curves if len(c) and c.steps[0] == 0]
    if not curves:
        return Curve(np.zeros(0), np.zeros(0), np.zeros(0))
    rest = [(c.steps[1:], c.compute[1:], c.values[1:]) for c in curves]
    steps = np.concatenate([[0.0]] + [r[0] for r in rest])
    compute = np.concatenate([[0.0]] + [r[1] for r in rest])
    values = np.concatenate([[float(np.mean([c.values[0] for c in curves]))]] + [r[2] for r in rest])
    order = np.argsort(compute, kind="stable")
    return Curve(steps[order], compute[order], values[order], curves[0].unit)
