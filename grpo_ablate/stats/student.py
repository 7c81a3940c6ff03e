"""Student's t distribution: its quantile and upper tail, for any df > 0 (Welch's df is fractional).

These are scipy's Student-t functions themselves (scipy.stats.t's ppf and sf call them), taken
from scipy.special: scipy.stats costs ~0.7 s to import, most of a small report's time.
"""
from __future__ import annotations

from scipy import special


def t_quantile(p: float, df: float) -> float:
    """Student-t quantile for p in (0, 1) and any df > 0: scipy.stats.t.ppf, the same source the
    sequential boundaries and the power calculations (stats/group_sequential.py) use."""
    return float(special.stdtrit(df, p))


def t_tail(t: float, df: float) -> float:
    """P(T >= t) for Student's t with df degrees of freedom: scipy.stats.t.sf."""
    return float(special.stdtr(df, -t))
