"""A sweep's star families as randomized complete block designs: seeds are blocks, variants are
treatments, and every contrast of a family shares one arm (the hub: leave-one-out's `all`,
add-one-in's base, a control). docs/statistics.md gives the simulations that chose this model.

The design, its formulas and references: docs/statistics.md, "The blocked model's estimator".
In short, for a hub and its leaves over the seeds every one of them completed:

- a leaf whose Δ to the hub is the same at every seed (an inert twin, a shifted copy) leaves the fit:
  its contrast is paired, where it has no spread to test against;
- each arm's variance is Shukla's unbiased estimate; one that comes out ≤ 0 is unknown, not zero;
- the leaves' variances are moderated towards the pooled one by limma's empirical Bayes, the prior's
  df fitted to the spread that Shukla's estimates show beyond their own (effective) df;
- the hub keeps the pooled (moderated) variance unless a one-sided F test finds it noisier than the
  leaves (Bancroft's preliminary test, at Rules.hub_test_level), then its own estimate with its own S − 1 df
  (at four seeds or fewer, whenever its own estimate is the larger);
- the whole star is tested paired instead when the hub's own estimate clips (nothing is known of its
  variance) or when the arms' residuals move together at the seeds (a shared seed shock, which the
  model's independent residuals cannot hold: `shock_p`, a parametric bootstrap at Rules.shock_test_level).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import special

from grpo_ablate.stats.intervals import ZERO_SPREAD, Estimate, eval_noise, grid_mean_sd, satterthwaite
from grpo_ablate.stats.student import t_quantile, t_tail

SHOCK_DRAWS = 400          # the shared-shock check's parametric bootstrap draws (a seeded generator)


@dataclass(frozen=True)
class Rules:
    """The model's rules, each chosen by simulation (docs/statistics.md, "The blocked model";
    benchmarks/report_blocked_sim.py --ablation measures each one's price): `hub_test_level`, the
    preliminary F test's level above which the hub keeps its own variance (0: never, 1: whenever its own
    estimate is larger); `shock_test_level`, the shared-shock check's (0: off); `hub_clip_paired`, a hub
    whose own estimate clips sends its star to the paired test (else it gets the prior, as a leaf does);
    `twins_out`, a leaf with the same Δ to the hub at every seed leaves the fit; `effective_df`, Shukla's
    estimates count their effective df (else S − 1) in the prior's fit and its weights; `few_seeds`: at
    this many seeds or fewer the hub keeps its own variance whenever it is the larger (an F test on
    S − 1 ≤ 3 df finds a 3× noisier hub too rarely: 7.1% false reports at 3 seeds with the 15% test)."""
    hub_test_level: float = 0.15
    few_seeds: int = 4
    shock_test_level: float = 0.05
    hub_clip_paired: bool = True
    twins_out: bool = True
    effective_df: bool = True


RULES = Rules()


@dataclass(frozen=True)
class BlockedFit:
    """One star family fitted: `seeds` the blocks (every modelled variant completed each), `own` each
    variant's Shukla estimate (None where it clipped: unknown), `var` / `df` the variance used for it and
    its degrees of freedom, `prior_df` the empirical-Bayes d0 (inf: variances alike), `pooled` the pooled
    residual variance and `pooled_df` its (V − 1)(S − 1); `hub_p` the preliminary test's p (the hub
    noisier than its leaves) and `hub_own` whether the hub kept its own variance; `shock_p` the
    shared-shock check's p; `left_out` the leaves whose Δ to the hub is the same at every block (they
    are paired, outside the fit); `paired` why the star is tested paired instead, or None."""
    hub: str
    seeds: tuple
    own: dict
    var: dict
    df: dict
    prior_df: float
    pooled: float
    pooled_df: int
    hub_p: float = 1.0
    hub_own: bool = False
    shock_p: float = 1.0
    left_out: tuple = ()
    paired: str | None = None
    leaves: tuple = field(default=())
    hub_tested: bool = True           # the hub's own variance decided by its F test (else: too few seeds)

    @property
    def alike(self) -> bool:
        """Whether the variances looked alike: the prior carries at least as many df as the pooled model."""
        return self.prior_df >= self.pooled_df

    def tests(self, leaf: str) -> bool:
        """Whether this fit tests the hub against `leaf` (else its contrast is paired)."""
        return self.paired is None and leaf in self.leaves

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
        """One line: the model, its blocks, what it borrowed, and what it left paired."""
        twins = (f"; {', '.join(f'`{v}`' for v in self.left_out)} left out (the same Δ to `{self.hub}` at every "
                 "seed: paired)" if self.left_out else "")
        if self.paired is not None:
            return f"`{self.hub}`'s star tested paired: {self.paired}{twins}"
        unknown = [v for v in self.leaves if self.own.get(v) is None]
        how = ("variances alike: every leaf gets the pooled variance" if self.alike else
               f"each leaf's variance moderated towards the pooled one by a prior worth {self.prior_df:.1f} df")
        if unknown:
            how += f" ({len(unknown)} estimate{'s' * (len(unknown) != 1)} ≤ 0: unknown, given the prior)"
        hub = (f"`{self.hub}` noisier than its leaves (F test p = {self.hub_p:.2g}): its own variance, "
               f"{len(self.seeds) - 1} df" if self.hub_own and self.hub_tested else
               f"`{self.hub}`'s own variance, {len(self.seeds) - 1} df (larger than the pooled one; with "
               f"{len(self.seeds)} seeds the F test cannot let it borrow)" if self.hub_own else
               f"`{self.hub}` not found noisier than its leaves (F test p = {self.hub_p:.2g}): "
               + ("the pooled variance too" if self.alike else "moderated as they are"))
        return (f"blocked model over {len(self.leaves) + 1} variants × {len(self.seeds)} seeds (residual df "
                f"{self.pooled_df}); {how}; {hub}{twins}")


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


def fit_star(values: dict, hub: str, leaves: list[str], granularity: float | None = None,
             rules: Rules | None = None) -> BlockedFit | None:
    """The blocked model of a hub and its leaves, `values` variant -> {seed: number} (module docstring).
    The blocks are the seeds with a finite number of the hub; a leaf missing one of them is left out
    (its contrast is then paired), and so is a leaf whose Δ to the hub is the same at every block (on
    the eval's grid `granularity`: `left_out`). None when fewer than two leaves or two blocks remain.
    `rules`: the model's rules (default the module's RULES, which benchmarks/report_blocked_sim.py varies)."""
    rules = rules or RULES
    finite = lambda x: x is not None and math.isfinite(x)
    seeds = tuple(sorted((s for s, x in values.get(hub, {}).items() if finite(x)), key=str))
    complete = [v for v in leaves if all(finite(values.get(v, {}).get(s)) for s in seeds)]
    if len(seeds) < 2:
        return None
    spread = lambda v: grid_mean_sd(np.array([values[hub][s] - values[v][s] for s in seeds]), granularity)[1]
    if len(complete) < 2:
        return None
    left_out = tuple(v for v in complete if rules.twins_out and spread(v) == 0.0)
    kept = [v for v in complete if v not in left_out]
    if len(kept) < 2:          # nothing left to fit: every contrast paired, the twins' with no spread
        return BlockedFit(hub, seeds, {}, {}, {}, math.inf, math.nan, 0, left_out=left_out, leaves=tuple(kept),
                          paired="fewer than two of its leaves differ from it by more than a constant")
    names = [hub, *kept]
    y = np.array([[values[v][s] for s in seeds] for v in names], dtype=float)
    raw, pooled, pooled_df = shukla_variances(y)
    own = {v: (float(x) if x > 0 else None) for v, x in zip(names, raw)}
    S = len(seeds)
    d = shukla_df(len(names), S) if rules.effective_df else float(S - 1)
    prior_df = prior_degrees_of_freedom(np.array([x if x > 0 else np.nan for x in raw]), d)
    var, df = {}, {}
    for v, x in zip(names, raw):
        if math.isinf(prior_df):
            var[v], df[v] = pooled, float(pooled_df)
        elif x > 0:
            var[v], df[v] = (prior_df * pooled + d * x) / (prior_df + d), min(prior_df + d, float(pooled_df))
        else:                                     # unknown: the prior's location, with the prior's df
            var[v], df[v] = pooled, min(prior_df, float(pooled_df))
    hub_p = hub_noisier_p(y)
    larger_is_enough = rules.hub_test_level >= 1 or S <= rules.few_seeds
    hub_own = (hub_p < rules.hub_test_level or larger_is_enough) and raw[0] > var[hub]
    if hub_own:                                   # its own variance, and the df of its own
        var[hub], df[hub] = float(raw[0]), float(S - 1)
    paired = None
    if raw[0] <= 0 and rules.hub_clip_paired:
        paired = (f"`{hub}`'s own variance estimate came out ≤ 0, so nothing is known of its variance "
                  "(the model would read it as none)")
    shock_p = 1.0
    if paired is None and rules.shock_test_level > 0:
        shock_p = shared_shock_p(y, np.array([var[v] for v in names]))
        if shock_p < rules.shock_test_level:
            paired = (f"the arms' residuals move together at the seeds (a shared seed shock, check p = "
                      f"{shock_p:.2g} < {rules.shock_test_level:g}), which the model's independent arms cannot hold")
    return BlockedFit(hub, seeds, own, var, df, prior_df, pooled, pooled_df, hub_p, hub_own, shock_p, left_out,
                      paired, tuple(kept), not larger_is_enough)


def shukla_variances(y: np.ndarray) -> tuple[np.ndarray, float, int]:
    """(each row's unbiased variance, unclipped: it can come out ≤ 0; the pooled residual variance; its
    df) of a variants × blocks table under the additive model with a variance per row (Shukla 1972)."""
    v, s = y.shape
    resid = double_centred(y)
    per_row = (resid ** 2).sum(axis=1)
    total = float(per_row.sum())
    pooled_df = (v - 1) * (s - 1)
    own = v / ((v - 2) * (s - 1)) * (per_row - total / (v * (v - 1)))    # v >= 3: a hub and two leaves
    return own, total / pooled_df, pooled_df


def double_centred(y: np.ndarray) -> np.ndarray:
    """The residuals of the additive fit (row and column means removed) of one table or a stack of them."""
    return y - y.mean(axis=-1, keepdims=True) - y.mean(axis=-2, keepdims=True) + y.mean(axis=(-2, -1), keepdims=True)


def shukla_df(v: int, s: int) -> float:
    """The effective degrees of freedom of one row's Shukla estimate under equal variances, 2σ⁴ / Var(σ̂²):
    (S − 1)(V − 2)² / ((V − 1)² − 2 + 1/(V − 1)), from its quadratic form in the normal residuals
    (2.93 at 7 × 5, not S − 1 = 4; tests/test_report_blocked.py checks it by simulation)."""
    return (s - 1) * (v - 2) ** 2 / ((v - 1) ** 2 - 2 + 1 / (v - 1))


def prior_degrees_of_freedom(variances: np.ndarray, d: float) -> float:
    """limma's fitFDist d0 (Smyth 2004, section 6.2) for sample variances with d df each: the spread of
    their logs beyond the sampling variance trigamma(d/2) that d df alone give; inf when it is none.
    An estimate that is not > 0 (NaN: clipped) is unknown and left out of the fit; with fewer than two
    known, nothing says the variances differ (inf)."""
    x = np.asarray(variances, dtype=float)
    x = x[np.isfinite(x) & (x > 0)]
    if len(x) < 2:
        return math.inf
    extra = float(np.log(x).var(ddof=1)) - float(special.polygamma(1, d / 2))
    return 2.0 * trigamma_inverse(extra) if extra > 0 else math.inf


def hub_noisier_p(y: np.ndarray) -> float:
    """The one-sided p of "the hub (row 0) is noisier than its leaves": F = the variance over blocks of the
    hub minus the leaves' mean, over its expectation (1 + 1/L) σ_L² under equal variances, σ_L² the
    leaves' own pooled residual variance; F(S − 1, (L − 1)(S − 1)) under equal normal variances, the two
    parts independent (the hub's contrast with the leaves' mean is orthogonal to the leaves' residuals)."""
    v, s = y.shape
    leaves = y[1:]
    num = float(np.var(y[0] - leaves.mean(axis=0), ddof=1))
    l_df = (v - 2) * (s - 1)
    den = float((double_centred(leaves) ** 2).sum()) / l_df * (1 + 1 / (v - 1))
    if not den > 0:
        return 0.0 if num > 0 else 1.0
    return float(special.fdtrc(s - 1, l_df, num / den))


def residual_correlation(y: np.ndarray) -> np.ndarray:
    """The mean squared correlation between the rows of the additive fit's residuals (one table or a
    stack): small for independent arms, near 1 where groups of arms move together at the seeds."""
    e = double_centred(y)
    norm = np.sqrt((e ** 2).sum(axis=-1, keepdims=True))
    e = np.divide(e, norm, out=np.zeros_like(e), where=norm > 0)
    r = e @ np.swapaxes(e, -1, -2)
    upper = np.triu_indices(y.shape[-2], 1)
    return (r[..., upper[0], upper[1]] ** 2).mean(axis=-1)


def shared_shock_p(y: np.ndarray, variances: np.ndarray, draws: int = SHOCK_DRAWS) -> float:
    """The p of "the arms' residuals are independent" against arms that move together at a seed: the
    residual rows' mean squared correlation (`residual_correlation`) against its distribution over
    `draws` tables simulated from the fitted model (independent normal arms with the fitted variances),
    p = (1 + #{simulated ≥ observed}) / (1 + draws), a Monte Carlo test (scipy.stats.monte_carlo_test
    computes the same: tests/test_report_blocked.py). The generator is seeded: a table has one p."""
    rng = np.random.default_rng(20260601)
    v, s = y.shape
    sd = np.sqrt(np.maximum(np.asarray(variances, dtype=float), 0.0))
    sim = rng.standard_normal((draws, v, s)) * sd[None, :, None]
    observed = float(residual_correlation(y))
    tied = 100 * np.finfo(float).eps * abs(observed)       # scipy's tolerance for equal values
    return float((1 + np.count_nonzero(residual_correlation(sim) >= observed - tied)) / (1 + draws))


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
