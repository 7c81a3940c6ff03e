"""A sweep's star families as randomized complete block designs: seeds are blocks, variants are
treatments, and every contrast of a family shares one arm (the hub: leave-one-out's `all`,
add-one-in's base, a control). docs/statistics.md gives the simulations that chose this model.

The design, its formulas and references: docs/statistics.md, "The blocked model's estimator".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from grpo_ablate.stats.intervals import ZERO_SPREAD, Estimate, eval_noise, grid_mean_sd, satterthwaite
from grpo_ablate.stats.student import t_quantile, t_tail


@dataclass(frozen=True)
class BlockedFit:
    """One star family fitted: `seeds` the blocks (every modelled variant completed each), `own` each
    variant's unbiased variance, `var` / `df` the variance used for it and its degrees of freedom
    (moderated; the hub's never below its own), `prior_df` the empirical-Bayes d0 (inf: variances alike),
    `pooled` the pooled residual variance and `pooled_df` its (V − 1)(S − 1)."""
    hub: str
    seeds: tuple
    own: dict
    var: dict
    df: dict
    prior_df: float
    pooled: float
    pooled_df: int

    @property
    def alike(self) -> bool:
        """Whether the variances looked alike: the prior carries at least as many df as the pooled model."""
        return self.prior_df >= self.pooled_df

    def contrast_variance(self, a: str, b: str) -> tuple[float, float] | None:
        """(Var(Δ̂) of a − b over the blocks, its Welch–Satterthwaite df capped at the pooled df);
        None when neither side has any spread."""
        n = len(self.seeds)
        found = satterthwaite([(self.var[v] / n, self.df[v] + 1) for v in (a, b)])
        if found is None:
            return None
        var, df = found
        return var, min(df, float(self.pooled_df))

    def describe(self) -> str:
        """One line: the model, its blocks and whether it borrowed."""
        how = ("variances alike: every arm gets the pooled variance" if self.alike else
               f"variances differ: each arm's own ({len(self.seeds) - 1} df) moderated by a prior worth "
               f"{self.prior_df:.1f} df")
        return (f"blocked model over {len(self.own)} variants × {len(self.seeds)} seeds (residual df "
                f"{self.pooled_df}); {how}; `{self.hub}`'s variance never below its own estimate")


def stars(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    """hub -> its leaves among a family's contrasts (a, b): a hub is an arm of two or more contrasts,
    a leaf the other arm of one of them when it is in no other contrast. Contrasts between two shared
    arms (a ladder's inner steps, every pair of a pairwise sweep) belong to no star."""
    count: dict[str, int] = {}
    for a, b in pairs:
        for arm in (a, b):
            count[arm] = count.get(arm, 0) + 1
    out: dict[str, list[str]] = {}
    for a, b in pairs:
        for hub, leaf in ((a, b), (b, a)):
            if count[hub] >= 2 and count[leaf] == 1:
                out.setdefault(hub, []).append(leaf)
    return {hub: leaves for hub, leaves in out.items() if len(leaves) >= 2}


def blocked_delta(fit: BlockedFit, a: str, b: str, values: dict, granularity: float | None = None,
                  problems: dict | None = None, level: float = 0.95, sampling: dict | None = None) -> Estimate:
    """Δ = a − b of a fitted star (one arm its hub) as an Estimate: the paired mean over the model's
    blocks (on the eval's grid, stats/intervals.py), its SE from the model's variances, widened by the
    eval set's problem-sampling term when `problems` (seed -> (a scores, b scores)) covers every block;
    the t quantile and p-value at the contrast's Welch–Satterthwaite df."""
    seeds = list(fit.seeds)
    d = np.array([values[a][s] - values[b][s] for s in seeds], dtype=float)
    mean, _ = grid_mean_sd(d, granularity)
    leaf = b if a == fit.hub else a
    dropped = {s: f"not a block of the model (`{fit.hub}` has no number there)"
               for s, x in values.get(leaf, {}).items() if s not in fit.seeds and x is not None and math.isfinite(x)}
    basis = f"blocked over seeds {', '.join(map(str, seeds))}" + (
        f" ({len(dropped)} dropped: " + "; ".join(f"seed {s} {why}" for s, why in dropped.items()) + ")"
        if dropped else "")
    est = Estimate(mean, None, None, len(seeds), basis, granularity=granularity, dropped=dropped)
    found = fit.contrast_variance(a, b)
    scale = max(1.0, float(np.abs(d).max()))
    if found is None or math.sqrt(found[0]) <= ZERO_SPREAD * scale:     # every variant a shifted copy: no spread
        est.low = est.high = mean
        est.se, est.df = 0.0, float(fit.pooled_df)
        return est
    var, df = found
    se = math.sqrt(var)
    noise = eval_noise(problems, seeds, se, sampling) if problems and all(s in problems for s in seeds) else None
    if noise is not None:
        se = noise.se
        est.basis += f", seeds × {noise.problems} problems"
    half = t_quantile(0.5 + level / 2, df) * se
    est.low, est.high, est.se, est.df, est.eval_noise = mean - half, mean + half, se, df, noise
    est.p = 2.0 * t_tail(abs(mean) / se, df)
    return est


def fit_star(values: dict, hub: str, leaves: list[str]) -> BlockedFit | None:
    """The blocked model of a hub and its leaves, `values` variant -> {seed: number}. The blocks are the
    seeds with a finite number of the hub; a leaf missing one of them is left out (its contrast is then
    paired). None when fewer than two leaves or two blocks remain."""
    finite = lambda x: x is not None and math.isfinite(x)
    seeds = tuple(sorted((s for s, x in values.get(hub, {}).items() if finite(x)), key=str))
    complete = [v for v in leaves if all(finite(values.get(v, {}).get(s)) for s in seeds)]
    if len(complete) < 2 or len(seeds) < 2:
        return None
    names = [hub, *complete]
    y = np.array([[values[v][s] for s in seeds] for v in names], dtype=float)
    own, pooled, pooled_df = shukla_variances(y)
    d = float(len(seeds) - 1)
    prior_df = prior_degrees_of_freedom(own, d)
    if math.isinf(prior_df):
        moderated, moderated_df = np.full(len(names), pooled), float(pooled_df)
    else:
        moderated, moderated_df = (prior_df * pooled + d * own) / (prior_df + d), min(prior_df + d, pooled_df)
    moderated[0] = max(moderated[0], own[0])      # the hub: borrowing may raise its variance, never lower it
    var = {v: float(m) for v, m in zip(names, moderated)}
    df = {v: float(moderated_df) for v in names}
    return BlockedFit(hub, seeds, {v: float(x) for v, x in zip(names, own)}, var, df, prior_df, pooled, pooled_df)


def shukla_variances(y: np.ndarray) -> tuple[np.ndarray, float, int]:
    """(each row's unbiased variance, clipped at 0; the pooled residual variance; its df) of a
    variants × blocks table under the additive model (module docstring)."""
    v, s = y.shape
    resid = y - y.mean(axis=1, keepdims=True) - y.mean(axis=0, keepdims=True) + y.mean()
    per_row = (resid ** 2).sum(axis=1)
    total = float(per_row.sum())
    pooled_df = (v - 1) * (s - 1)
    own = v / ((v - 2) * (s - 1)) * (per_row - total / (v * (v - 1)))    # v >= 3: a hub and two leaves
    return np.maximum(own, 0.0), total / pooled_df, pooled_df


def prior_degrees_of_freedom(variances: np.ndarray, d: float) -> float:
    """limma's fitFDist d0 (Smyth 2004, section 6.2) for sample variances with d df each: the spread of
    their logs beyond the sampling variance trigamma(d/2) that d df alone give; inf when it is none.
    A variance of exactly 0 enters at 1e-5 of the mean (limma floors at 1e-5 of the median)."""
    x = np.asarray(variances, dtype=float)
    if len(x) < 2 or not (x > 0).any():
        return math.inf
    x = np.maximum(x, 1e-5 * float(x[x > 0].mean()))
    extra = float(np.log(x).var(ddof=1)) - float(special.polygamma(1, d / 2))
    return 2.0 * trigamma_inverse(extra) if extra > 0 else math.inf


def trigamma_inverse(x: float) -> float:
    """y with trigamma(y) = x, by limma's Newton iteration (Smyth 2004): from y = 0.5 + 1/x."""
    if x > 1e7:
        return 1.0 / math.sqrt(x)
    if x < 1e-6:
        return 1.0 / x
    y = 0.5 + 1.0 / x
    for _ in range(50):
        tri = float(special.polygamma(1, y))
        step = tri * (1.0 - tri / x) / float(special.polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            break
    return y
