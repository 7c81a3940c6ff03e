"""Error control over a family of tests: each p-value adjusted over the family (`adjust`: Holm's
step-down, the default, keeps the family-wise error ≤ alpha; Benjamini–Hochberg the false
discovery rate), and Holm's rejections at a level (`holm`) for the transfer grid's interaction tests.
"""
from __future__ import annotations

import numpy as np

ALPHA = 0.05
ERROR_CONTROL = {"holm": "Holm", "bh": "Benjamini–Hochberg", "none": "no error control"}


def adjust(pvalues: list, method: str = "holm", alpha: float = ALPHA) -> list:
    """Each p-value adjusted over the family of the non-None ones (None stays None).
    holm: Holm's step-down, p_(i) ← max_{j ≤ i} min(1, (m − j + 1) p_(j)) over the sorted p-values,
    rejecting where the adjusted p < alpha keeps the family-wise error ≤ alpha under any dependence
    (Holm 1979); written out here because statsmodels' `multipletests` forces a full garbage
    collection on every Holm call (~0.25 s in a report's process), and checked against it in
    tests/test_error_control.py. bh: Benjamini–Hochberg (false discovery rate ≤ alpha for
    independent or positively dependent tests), scipy's `false_discovery_control`. none: as they are."""
    if method not in ERROR_CONTROL:
        raise ValueError(f"error control {method!r}: allowed {', '.join(ERROR_CONTROL)}")
    tested = [i for i, p in enumerate(pvalues) if p is not None]
    out = list(pvalues)
    if method == "none" or not tested:
        return out
    p = np.array([pvalues[i] for i in tested], dtype=float)
    if method == "bh":
        from scipy import stats   # (only here: scipy.stats costs ~0.7 s to import, stats/student.py)

        adjusted = stats.false_discovery_control(p, method="bh")
    else:
        order = np.argsort(p, kind="stable")
        m = len(p)
        stepped = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
        adjusted = np.empty(m)
        adjusted[order] = stepped
    for i, q in zip(tested, adjusted):
        out[i] = float(q)
    return out


def holm(pvalues: list[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down: which of the hypotheses are rejected, family-wise error ≤ alpha."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    rejected = [False] * len(pvalues)
    for rank, i in enumerate(order):
        if pvalues[i] > alpha / (len(pvalues) - rank):
            break
        rejected[i] = True
    return rejected
