"""Means and differences of means over seeds (and eval problems), with their 95% intervals
and p-values: a variant's mean (`mean_ci`), a trick's Δ paired on seeds (`delta_ci`, `paired_ci`),
Welch's test for two sides that share no seed (`welch_test`, `welch_ci`; its degrees of freedom,
`satterthwaite`, also for any sum of independent means), and the eval set's
share of a paired Δ's noise (`eval_noise`).

The design, its formulas and references: docs/statistics.md, "Means, differences and their intervals".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from grpo_ablate.stats.student import t_quantile, t_tail

ZERO_SPREAD = 1e-12        # without a grid: a spread below this (relative to the scale) is float noise


@dataclass
class EvalNoise:
    """How much of a paired Δ's uncertainty is the eval set's (see the module docstring):
    `share`: σ̂_e²/P over the seed-to-seed variance of Δ (scoring on P problems, not the task);
    `problem_var`: σ̂_b²/P, added to Var(Δ̄) for the choice of problems; `se_seeds` / `se`: Δ̄'s
    standard error without / with it; `se_at`: the SE at 2× and 4× the eval set (same seeds).
    With n >= 2 samples per problem (avg@n): `sampling_share`, the part of the seed-to-seed variance
    of Δ that is the draw of those samples (the within-problem binomial term), and `se_at_samples`,
    the SE at 2× and 4× the samples per problem (same seeds and problems); None / {} otherwise."""
    problems: int
    share: float
    problem_var: float
    se_seeds: float
    se: float
    se_at: dict
    sampling_share: float | None = None
    se_at_samples: dict = field(default_factory=dict)


@dataclass
class Estimate:
    """A mean (or a difference of means) with its 95% interval; low/high None without one.
    `p`: the two-sided p-value of "the mean is zero" (None without a test); `p_adjusted`: after the
    report's error control over its family; `dropped`: seeds left out of a paired Δ, and why."""
    mean: float | None = None
    low: float | None = None
    high: float | None = None
    n: int = 0
    basis: str = "no data"
    p: float | None = None
    p_adjusted: float | None = None
    se: float | None = None
    df: float | None = None
    granularity: float | None = None
    eval_noise: EvalNoise | None = None
    dropped: dict = field(default_factory=dict)

    @property
    def has_ci(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def zero_spread(self) -> bool:
        """An interval of zero width from every seed giving the same Δ: no test is possible."""
        return self.has_ci and self.se == 0.0

    def interval(self, level: float) -> tuple[float, float] | None:
        """The two-sided interval at another level (e.g. Bonferroni's 1 − alpha/m), None without one."""
        if not self.has_ci or self.se is None or self.df is None:
            return None
        half = t_quantile(0.5 + level / 2, self.df) * self.se
        return self.mean - half, self.mean + half


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


def delta_ci(treated: dict, reference: dict, level: float = 0.95, granularity: float | None = None,
             problems: dict | None = None, sampling: dict | None = None) -> Estimate:
    """Δ = mean(treated) − mean(reference), values keyed by seed: paired over the seeds both
    sides have (a seed missing on one side is dropped and said); Welch's interval only when they
    share none (each side needs n >= 2). `granularity`: the grid of the values (module docstring);
    `problems`: seed -> (treated, reference) per-problem scores whose means are the values, for
    the eval-noise term (module docstring); `sampling`: seed -> the variance of that seed's Δ over the
    draw of the eval's samples (eval_noise)."""
    treated = {k: v for k, v in treated.items() if v is not None and math.isfinite(v)}
    reference = {k: v for k, v in reference.items() if v is not None and math.isfinite(v)}
    if not treated or not reference:
        return Estimate()
    shared = sorted(set(treated) & set(reference), key=str)
    if shared:
        dropped = {s: "no number on the reference side" for s in treated if s not in reference}
        dropped.update({s: "no number on the treated side" for s in reference if s not in treated})
        return paired_ci({s: treated[s] - reference[s] for s in shared}, level, granularity,
                         problems, dropped, sampling)
    return welch_ci(np.array(list(treated.values())), np.array(list(reference.values())), level)


def paired_ci(diffs: dict, level: float = 0.95, granularity: float | None = None, problems: dict | None = None,
              dropped: dict | None = None, sampling: dict | None = None) -> Estimate:
    """The paired t-interval and two-sided p-value of seed -> Δ (counted on the grid when every Δ lies
    on it, module docstring), widened by the eval set's problem-sampling term when `problems`
    covers every seed."""
    seeds = sorted(diffs, key=str)
    d = np.array([diffs[s] for s in seeds], dtype=float)
    n = len(d)
    basis = f"paired over seed{'s' if n > 1 else ''} {', '.join(map(str, seeds))}"
    if dropped:
        basis += f" ({len(dropped)} dropped: " + "; ".join(f"seed {s} {why}" for s, why in sorted(
            dropped.items(), key=lambda kv: str(kv[0]))) + ")"
    mean, sd = grid_mean_sd(d, granularity)
    est = Estimate(mean, None, None, n, basis, granularity=granularity, dropped=dict(dropped or {}))
    if n < 2:
        est.basis += ", no CI"
        return est
    se = sd / math.sqrt(n)
    noise = eval_noise(problems, seeds, se, sampling) if problems else None
    if noise is not None:
        se = noise.se
        est.basis += f", seeds × {noise.problems} problems"
    est.se, est.df, est.eval_noise = se, float(n - 1), noise
    half = t_quantile(0.5 + level / 2, n - 1) * se
    est.low, est.high = mean - half, mean + half
    est.p = None if se == 0.0 else 2.0 * t_tail(abs(mean) / se, n - 1)
    return est


def grid_mean_sd(d: np.ndarray, granularity: float | None) -> tuple[float, float]:
    """The mean and SD (ddof 1; 0 for one value) of paired differences, counted in eval problems when
    every one lies on the grid (module docstring), else as floats with a spread below ZERO_SPREAD of
    their scale read as none."""
    n = len(d)
    units = np.round(d / granularity) if granularity else None
    if units is not None and np.abs(d / granularity - units).max() < 1e-6:   # on the grid: count in problems
        return float(units.mean() * granularity), float(units.std(ddof=1) * granularity) if n > 1 else 0.0
    mean, sd = float(d.mean()), float(d.std(ddof=1)) if n > 1 else 0.0
    if sd <= ZERO_SPREAD * max(1.0, float(np.abs(d).max())):    # equal Δs up to float noise
        sd = 0.0
    return mean, sd


def satterthwaite(parts: list[tuple[float, int]]) -> tuple[float, float] | None:
    """The variance of a sum of independent means, V = Σ v_i, and its Welch–Satterthwaite degrees
    of freedom V² / Σ v_i² / (n_i − 1), from each mean's variance v_i = s_i² / n_i and its n_i >= 2
    values; None when V is not > 0 (no spread anywhere). The arithmetic keeps its operands' types
    (numpy's from `welch_ci`, plain floats from report/transfer.py's interaction test)."""
    var = sum(v for v, _ in parts)
    if not var > 0:
        return None
    return var, var ** 2 / sum(v ** 2 / (n - 1) for v, n in parts)


def welch_test(diff: float, var_a: float, n_a: int, var_b: float, n_b: int) -> tuple[float, float, float] | None:
    """Welch's t-test on a difference of two means `diff` = mean(a) − mean(b), from each side's sample
    variance (ddof 1) and size (each >= 2): (its standard error, the Welch–Satterthwaite df, the
    two-sided p-value); None when neither side has any spread."""
    found = satterthwaite([(var_a / n_a, n_a), (var_b / n_b, n_b)])
    if found is None:
        return None
    var, df = found
    se = math.sqrt(var)
    return se, df, 2.0 * t_tail(abs(diff) / se, df)


def welch_ci(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> Estimate:
    """Welch's interval and p-value for two sides that share no seed."""
    diff = float(a.mean() - b.mean())
    basis = f"Welch, n={len(a)} vs {len(b)} (no seed on both sides)"
    if len(a) < 2 or len(b) < 2:
        return Estimate(diff, None, None, min(len(a), len(b)), basis + ", no CI")
    found = welch_test(diff, a.var(ddof=1), len(a), b.var(ddof=1), len(b))
    if found is None:
        return Estimate(diff, diff, diff, min(len(a), len(b)), basis, se=0.0, df=1.0)
    se, df, p = found
    half = t_quantile(0.5 + level / 2, df) * se
    return Estimate(diff, diff - half, diff + half, min(len(a), len(b)), basis, p=p, se=se, df=df)


def eval_noise(problems: dict, seeds: list, se_seeds: float, sampling: dict | None = None) -> EvalNoise | None:
    """The crossed seeds × problems variance components of a paired Δ (module docstring), from
    seed -> (treated scores, reference scores) on the same P problems; None unless every seed
    has both, of one length P >= 2. `sampling`: seed -> the variance of its Δ over the draw of the
    eval's samples (evals/scores.paired_sampling_variance), which lies inside the seed-to-seed
    variance: its share of it, and the SE with more samples per problem (that term divided)."""
    rows = [problems.get(s) for s in seeds]
    if any(r is None for r in rows):
        return None
    table = [np.asarray(a, float) - np.asarray(b, float) for a, b in rows]
    P = len(table[0])
    if P < 2 or any(len(t) != P for t in table) or len(table) < 2:
        return None
    d = np.vstack(table)
    n = d.shape[0]
    grand, by_seed, by_problem = d.mean(), d.mean(axis=1), d.mean(axis=0)
    ms_seed = P * float(((by_seed - grand) ** 2).sum()) / (n - 1)
    ms_problem = n * float(((by_problem - grand) ** 2).sum()) / (P - 1)
    resid = d - by_seed[:, None] - by_problem[None, :] + grand
    ms_resid = float((resid ** 2).sum()) / ((n - 1) * (P - 1))
    problem_var = max(0.0, ms_problem - ms_resid) / (n * P)          # σ̂_b² / P
    seed_var = max(0.0, ms_seed - ms_resid) / P                      # σ̂_a²
    se = math.sqrt(se_seeds ** 2 + problem_var)
    share = min(1.0, ms_resid / ms_seed) if ms_seed > 0 else (1.0 if ms_resid > 0 else 0.0)
    se_at = {}
    for factor in (2, 4):        # the same seeds on an eval set `factor` times larger
        bigger = factor * P
        se_at[factor] = math.sqrt(seed_var / n + problem_var * P / bigger + ms_resid / (n * bigger))
    noise = EvalNoise(P, share, problem_var, se_seeds, se, se_at)
    if sampling and all(sampling.get(s) is not None for s in seeds):
        within = float(np.mean([sampling[s] for s in seeds]))     # E[Var(Δ_s | the policies)]
        total = se_seeds ** 2 * n                                    # the seed-to-seed variance of Δ_s
        noise.sampling_share = min(1.0, within / total) if total > 0 else (1.0 if within > 0 else 0.0)
        noise.se_at_samples = {f: math.sqrt(max(0.0, se ** 2 - (1 - 1 / f) * min(within, total) / n)) for f in (2, 4)}
    return noise


def finite_mean(values) -> float | None:
    """The mean of the finite values, None when there is none (no interval: a table cell)."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(values)) if values else None
