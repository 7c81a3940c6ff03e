"""How a number or an estimate is written in the report's tables and sentences."""
from __future__ import annotations

import math

from grpo_ablate.stats.intervals import Estimate


def fmt_num(value, digits: int = 3, signed: bool = False) -> str:
    """A fixed-point number; — for none or a non-finite value."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def fmt_sig(value) -> str:
    """Three significant digits (KL values span orders of magnitude); — for none."""
    return "—" if value is None else f"{value:.3g}"


def fmt_p(p: float | None) -> str:
    """A p-value to two significant digits, in e-notation below 0.001 (as the verdicts' reasons write it)."""
    return "—" if p is None else f"{p:.2g}" if p >= 0.001 else f"{p:.1e}"


def fmt_estimate(est: Estimate | None, signed: bool = False) -> str:
    """mean ± half-width of the 95% CI, `(Welch)` when the seeds differ, `(n=1, no CI)` without one."""
    if est is None or est.mean is None:
        return "—"
    if not est.has_ci:
        return f"{fmt_num(est.mean, signed=signed)} (n={est.n}, no CI)"
    cell = f"{fmt_num(est.mean, signed=signed)} ± {(est.high - est.low) / 2:.3f}"
    return cell + (" (Welch)" if "Welch" in est.basis else "")


def fmt_delta(d: Estimate) -> str:
    """Δ = mean, 95% CI [low, high], basis; empty without a mean."""
    if d.mean is None:
        return ""
    text = f"Δ = {fmt_num(d.mean, signed=True)}"
    if d.has_ci:
        text += f", 95% CI [{fmt_num(d.low, signed=True)}, {fmt_num(d.high, signed=True)}], {d.basis}"
    return text
