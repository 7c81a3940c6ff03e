"""The null of report/drift.py's peak-versus-late statistic: its least favourable monotone curve,
a plateau, on which a run's statistic is (max of its `earlier` evals' standard normals) − (mean
of its `window` late ones). Drawn NULL_DRAWS times from a fixed seed (a run's p-value is the same
in every report; Monte-Carlo error of a 5% tail ≈ 0.0005), exactly and in O(draws) whatever the
run's length; an arm's runs are summed, each from its own stream.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy.special import ndtri

NULL_DRAWS = 200_000        # draws of the plateau null per shape (earlier evals, window)
NULL_SEED = 31              # fixed: a run's p-value is the same in every report


def tail(z: float, shapes: tuple[tuple[int, int], ...]) -> float:
    """P(statistic >= z) under the plateau null of the runs `shapes` ((earlier, window) each),
    their statistics summed; (1 + count) / (1 + draws), so never 0."""
    null = _null_sum(shapes)                      # sorted
    return float((1 + len(null) - np.searchsorted(null, z, side="left")) / (1 + len(null)))


@lru_cache(maxsize=64)
def _null_sum(shapes: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Σ over the runs of (max of `earlier` standard normals − mean of `window`), each run from
    its own stream so that runs of the same shape are independent draws. Drawn exactly and in
    O(draws) whatever the run's length: the max of m normals is Φ⁻¹(U^(1/m)), the mean of k
    is N(0, 1/k). Sorted, so that a tail is a binary search."""
    total = np.zeros(NULL_DRAWS)
    for i, (earlier, window) in enumerate(shapes):
        rng = np.random.default_rng([NULL_SEED, earlier, window, i])
        total += ndtri(rng.random(NULL_DRAWS) ** (1.0 / earlier)) - rng.standard_normal(NULL_DRAWS) / math.sqrt(window)
    return np.sort(total)
