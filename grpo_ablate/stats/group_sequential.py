"""Seeds until decided: a group-sequential paired t-test whose error rate survives repeated
looks, and the power of a contrast at the seeds it ran. Pure math (numpy, scipy).

The design, its formulas and references: docs/sequential.md, "The method".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize, special

from grpo_ablate.stats.student import t_quantile, t_tail

ALPHA = 0.05                 # two-sided: false helps + false hurts; a "beats" test runs at ALPHA / 2
POWER = 0.8
INITIAL_SEEDS = 3
MAX_SEEDS = 8
SPENDING = ("obrien-fleming", "pocock")
CALIBRATION_SEQUENCES = 1 << 20
CALIBRATION_SEED = 14               # frozen: the boundaries are the same on every machine
SEEDS_NEEDED_LIMIT = 10_000         # past this, "more than" is the honest answer

POSITIVE, NEGATIVE, EQUIVALENT, UNDECIDED = "positive", "negative", "equivalent", "undecided"


@dataclass(frozen=True)
class Plan:
    """How a sequential sweep decides. `effect` (in the metric's units) turns on the
    *no effect ≥ effect* stop; None: a contrast stops only on a difference or at the cap."""
    initial_seeds: int = INITIAL_SEEDS
    max_seeds: int = MAX_SEEDS
    alpha: float = ALPHA
    spending: str = "obrien-fleming"
    effect: float | None = None

    def __post_init__(self):
        if self.spending not in SPENDING:
            raise ValueError(f"spending {self.spending!r}: allowed {', '.join(SPENDING)}")
        if not 2 <= self.initial_seeds <= self.max_seeds:
            raise ValueError(f"need 2 <= initial seeds ({self.initial_seeds}) <= max seeds ({self.max_seeds})")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha {self.alpha} must be in (0, 1)")
        if self.effect is not None and not self.effect > 0:
            raise ValueError(f"effect {self.effect} must be > 0")


@dataclass(frozen=True)
class Look:
    """One contrast at one look: its paired seeds and what they say."""
    n: int                   # paired seeds (both sides completed)
    max_seeds: int           # the plan's maximum when the look was taken
    mean: float              # d̄, the mean paired difference
    sd: float                # s, the SD of the paired differences (ddof 1)


@dataclass(frozen=True)
class Decision:
    """Where a contrast stands after its looks. `look` is 1-based, None while undecided."""
    outcome: str             # positive | negative | equivalent | undecided
    look: int | None
    n: int                   # paired seeds at the deciding look (else the last)
    t: float                 # T at that look
    boundary: float          # c_k: |T| (one-sided: T) had to reach this there
    rci: tuple               # the repeated confidence interval (low, high) there (two-sided only)
    alpha_spent: float       # per side, up to and including that look
    final: bool              # the last look allowed: all alpha spent, no seed will be added
    replanned: bool = False  # see the module docstring: the maximum was raised after all was spent


# ----------------------------------------------------------------------------- spending
def spending_function(fraction: float, alpha_side: float, spending: str) -> float:
    """α*(t): the per-side alpha a test may have spent by information fraction t (Lan & DeMets)."""
    t = min(max(float(fraction), 0.0), 1.0)
    if t == 0.0:
        return 0.0
    if spending == "obrien-fleming":
        return 2.0 * float(special.ndtr(special.ndtri(alpha_side / 2.0) / math.sqrt(t)))   # 2 − 2Φ(z/√t)
    if spending == "pocock":
        return alpha_side * math.log(1.0 + (math.e - 1.0) * t)
    raise ValueError(f"spending {spending!r}: allowed {', '.join(SPENDING)}")


def spending_schedule(looks: list[tuple[int, int]], alpha_side: float, spending: str) -> tuple[list[float], bool]:
    """The cumulative per-side alpha of each look, from (n, max_seeds) per look, and whether
    the schedule was re-planned. With one maximum N throughout: α*(n_k / N). When N changes at
    look k, what is left is spread in proportion to α* on the new horizon:
        A_k = A_{k−1} + (a − A_{k−1}) · (α*(n_k/N_k) − α*(n_{k−1}/N_k)) / (a − α*(n_{k−1}/N_k)).
    When all was spent at an earlier look and N grew, the history is re-planned on the new N."""
    looks = [(int(n), int(m)) for n, m in looks]
    for k in range(1, len(looks)):
        if looks[k][1] > looks[k - 1][1] and looks[k - 1][0] >= looks[k - 1][1]:   # all spent, then raised
            replanned = [(n, looks[k][1]) for n, _ in looks[:k]] + looks[k:]
            return spending_schedule(replanned, alpha_side, spending)[0], True
    cumulative, spent, n_before = [], 0.0, 0
    for n, horizon in looks:
        done_here = spending_function(n / horizon, alpha_side, spending)
        done_before = spending_function(n_before / horizon, alpha_side, spending)
        left_on_scale = alpha_side - done_before
        if n >= horizon or left_on_scale <= 0.0:
            spent = alpha_side                          # the last look allowed spends the rest
        else:
            spent += (alpha_side - spent) * (done_here - done_before) / left_on_scale
        cumulative.append(float(min(spent, alpha_side)))
        n_before = n
    return cumulative, False


# ----------------------------------------------------------------------------- boundaries
@lru_cache(maxsize=256)
def t_boundaries(ns: tuple[int, ...], cumulative: tuple[float, ...], two_sided: bool,
                 sequences: int = CALIBRATION_SEQUENCES) -> tuple[float, ...]:
    """c_k on the t scale for looks at ns (strictly increasing, ≥ 2) spending `cumulative`
    per side: P_H0(no crossing before k, crossing at k) = increment (× 2 when two-sided).
    The first is a Student-t quantile; the others are found on `sequences` null sequences of
    the paired t-statistics (their law does not depend on the variance)."""
    if any(b <= a for a, b in zip(ns, ns[1:])) or ns[0] < 2:
        raise ValueError(f"looks must be at strictly increasing seed counts >= 2, got {ns}")
    increments = np.diff([0.0, *cumulative])
    sides = 2 if two_sided else 1
    bounds = [math.inf if increments[0] <= 0 else -t_quantile(increments[0], ns[0] - 1)]
    if len(ns) == 1:
        return tuple(bounds)
    rng = np.random.RandomState(CALIBRATION_SEED)
    size = sequences
    total, squares = np.zeros(size), np.zeros(size)      # Σ d and Σ (d − d̄)², updated one seed at a time
    alive = np.ones(size, dtype=bool)
    for n in range(1, ns[-1] + 1):
        d = rng.standard_normal(size)
        if n > 1:
            squares += (n - 1) / n * (d - total / (n - 1)) ** 2
        total += d
        if n not in ns:
            continue
        k = ns.index(n)
        t = (total / n) / np.sqrt(squares / (n - 1) / n)
        statistic = np.abs(t) if two_sided else t
        if k > 0:
            crossing = int(round(sides * increments[k] * size))
            still = statistic[alive]
            bounds.append(math.inf if crossing <= 0 or not len(still) else
                          float(np.partition(still, len(still) - crossing)[len(still) - crossing]))
        alive &= statistic < bounds[k]
    return tuple(bounds)


def boundaries(looks: list[tuple[int, int]], plan: Plan,
               two_sided: bool = True) -> tuple[list[float], list[float], bool]:
    """(c_k per look, cumulative per-side alpha per look, re-planned?) for (n, max_seeds) looks."""
    cumulative, replanned = spending_schedule(looks, plan.alpha / 2.0, plan.spending)
    ns = tuple(n for n, _ in looks)
    return list(t_boundaries(ns, tuple(round(a, 15) for a in cumulative), two_sided)), cumulative, replanned


# ----------------------------------------------------------------------------- deciding
def look_outcome(mean, sd, n, boundary, effect: float | None = None, two_sided: bool = True):
    """The outcome codes of looks (numpy-vectorised over sequences): +1 Δ > 0 shown, −1 Δ < 0
    shown (one-sided: the non-binding *worse* stop), 2 no effect ≥ `effect` (two-sided only),
    0 go on. A zero SD with a nonzero mean decides nothing (a coarse metric, not certainty)."""
    mean, sd, n = np.asarray(mean, float), np.asarray(sd, float), np.asarray(n, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(sd > 0, mean / (sd / np.sqrt(n)), 0.0)
        half = boundary * sd / np.sqrt(n)
    code = np.where(t >= boundary, 1, np.where(t <= -boundary, -1, 0))
    if effect is not None and two_sided:
        code = np.where((code == 0) & (sd > 0) & (np.abs(mean) + half < effect), 2, code)
    return code, t


def decide(looks: list[Look], plan: Plan, two_sided: bool = True) -> Decision:
    """Walk a contrast's looks; the first boundary crossed decides (later looks cannot undo
    it). A look counts only when it has more paired seeds than the one before; the last look
    is `final` when it reached its maximum (no alpha left)."""
    counted = []
    for look in looks:
        if look.n >= 2 and (not counted or look.n > counted[-1].n):
            counted.append(look)
    if not counted:
        n = looks[-1].n if looks else 0
        return Decision(UNDECIDED, None, n, math.nan, math.inf, (None, None), 0.0, False)
    bounds, spent, replanned = boundaries([(x.n, x.max_seeds) for x in counted], plan, two_sided)
    names = {1: POSITIVE, -1: NEGATIVE, 2: EQUIVALENT}
    for k, look in enumerate(counted):
        code, t = look_outcome(look.mean, look.sd, look.n, bounds[k], plan.effect, two_sided)
        final = spent[k] >= plan.alpha / 2.0 - 1e-12
        if int(code) != 0 or k == len(counted) - 1:
            outcome = names.get(int(code), UNDECIDED)
            half = bounds[k] * look.sd / math.sqrt(look.n) if two_sided and math.isfinite(bounds[k]) else None
            rci = (look.mean - half, look.mean + half) if half is not None else (None, None)
            return Decision(outcome, k + 1 if outcome != UNDECIDED else None, look.n, float(t), bounds[k], rci,
                            spent[k], final, replanned)
    raise AssertionError("unreachable: the last look always returns")


def paired_look(with_values: dict, without_values: dict, max_seeds: int) -> Look | None:
    """A Look from two sides' final values keyed by seed: the seeds both have, paired."""
    seeds = sorted(set(with_values) & set(without_values), key=str)
    d = np.array([with_values[s] - without_values[s] for s in seeds], dtype=float)
    if len(d) == 0:
        return None
    return Look(len(d), max_seeds, float(d.mean()), float(d.std(ddof=1)) if len(d) > 1 else 0.0)


# ----------------------------------------------------------------------------- power
def fixed_power(effect: float, sd: float, n: int, critical: float | None = None, level: float = ALPHA) -> float:
    """Power of a two-sided paired t-test with n pairs against a true Δ = effect:
    P(T' ≥ c) + P(T' ≤ −c), T' ~ nct(n − 1, effect √n / sd); c = t_{1−level/2, n−1} unless given."""
    if n < 2 or not sd > 0:
        return math.nan
    df = n - 1
    c = t_quantile(1.0 - level / 2.0, df) if critical is None else float(critical)
    ncp = effect * math.sqrt(n) / sd
    # the ufuncs, not stats.nct (a thousand times slower); P(T' ≤ −c) as P(T' ≥ c) at −ncp, since
    # the direct lower tail can come out NaN far from the centre
    upper = 1.0 - float(special.nctdtr(df, ncp, c))
    lower = 1.0 - float(special.nctdtr(df, -ncp, c))
    return min(1.0, max(0.0, upper) + (max(0.0, lower) if math.isfinite(lower) else 0.0))


def detectable_effect(sd: float, n: int, critical: float | None = None, level: float = ALPHA,
                      power: float = POWER) -> float | None:
    """The smallest true |Δ| that n paired seeds with paired SD `sd` detect with `power`:
    δ solving fixed_power(δ) = power (≈ (c + t_{power, n−1}) · sd / √n). None without a spread."""
    if n < 2 or not sd > 0 or (critical is not None and not math.isfinite(critical)):
        return None
    hi = sd
    while fixed_power(hi, sd, n, critical, level) < power:
        hi *= 2.0
    return float(optimize.brentq(lambda e: fixed_power(e, sd, n, critical, level) - power, 0.0, hi, xtol=1e-12 * sd))


def seeds_needed(effect: float, sd: float, level: float = ALPHA, power: float = POWER,
                 limit: int = SEEDS_NEEDED_LIMIT) -> int | None:
    """About how many paired seeds a fixed design needs to detect a true |Δ| = effect with
    `power` at two-sided `level`: the smallest n with fixed_power ≥ power. None when effect is
    0, there is no spread, or more than `limit` would be needed."""
    effect = abs(effect)
    if not effect > 0 or not sd > 0:
        return None
    if fixed_power(effect, sd, limit, level=level) < power:
        return None
    lo, hi = 2, limit                       # power grows with n: bisect for the first n that has it
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if fixed_power(effect, sd, mid, level=level) < power else (lo, mid)
    return lo


def nominal_level(boundary: float, n: int, two_sided: bool = True) -> float:
    """The p-value a t-test with n pairs must beat at a look with this boundary."""
    if not math.isfinite(boundary):
        return 0.0
    p = t_tail(boundary, n - 1)
    return 2.0 * p if two_sided else p


# ----------------------------------------------------------------------------- simulation
@dataclass(frozen=True)
class Simulated:
    """How a plan did over simulated contrasts: shares of sequences by outcome, and seeds."""
    sequences: int
    positive: float          # share stopped with Δ > 0 shown (helps / beats)
    negative: float          # share stopped with Δ < 0 shown (hurts / worse)
    equivalent: float        # share stopped with no effect ≥ plan.effect
    mean_seeds: float        # paired seeds a contrast ran before it stopped (the cap if never)

    @property
    def decided(self) -> float:
        return self.positive + self.negative + self.equivalent

    def standard_error(self, share: float) -> float:
        """The Monte-Carlo error of a share estimated from these sequences."""
        return math.sqrt(max(share * (1.0 - share), 1e-12) / self.sequences)


def simulate(plan: Plan, effect_sd: float, sequences: int, seed: int, correlation: float = 0.0,
             two_sided: bool = True, raise_max_to: int | None = None, raised_after: int | None = None) -> Simulated:
    """`sequences` sequential contrasts with normal seed noise: each side's metric has SD 1 over
    seeds (effect_sd is Δ in those units), the two sides of a seed share `correlation` of it,
    so the paired SD is √(2 (1 − correlation)). Decided by `look_outcome` on `boundaries`, as
    `decide` does. `raise_max_to`: the maximum is raised to this after the look at
    `raised_after` seeds (default: after plan.max_seeds, i.e. once all alpha is spent, which
    re-plans; see spending_schedule) and the still undecided contrasts go on."""
    rng = np.random.default_rng(seed)
    top = max(plan.max_seeds, raise_max_to or 0)
    d = effect_sd + math.sqrt(2.0 * (1.0 - correlation)) * rng.standard_normal((sequences, top))
    outcome = np.zeros(sequences, dtype=int)
    seeds = np.zeros(sequences, dtype=int)
    cut = plan.max_seeds if raise_max_to is None or raised_after is None else raised_after
    looks = [(n, plan.max_seeds) for n in range(plan.initial_seeds, cut + 1)]
    _walk(d, looks, plan, two_sided, outcome, seeds, np.ones(sequences, dtype=bool))
    if raise_max_to is not None:
        looks += [(n, raise_max_to) for n in range(cut + 1, raise_max_to + 1)]
        _walk(d, looks, plan, two_sided, outcome, seeds, outcome == 0)   # earlier decisions stand
    seeds[outcome == 0] = looks[-1][0]
    return Simulated(sequences, float(np.mean(outcome == 1)), float(np.mean(outcome == -1)),
                     float(np.mean(outcome == 2)), float(seeds.mean()))


def _walk(d, looks, plan, two_sided, outcome, seeds, todo) -> None:
    """First crossing per sequence (rows in `todo`), written into outcome / seeds in place."""
    bounds, _, _ = boundaries(looks, plan, two_sided)
    open_ = todo.copy()
    for (n, _), boundary in zip(looks, bounds):
        x = d[open_, :n]
        code, _ = look_outcome(x.mean(axis=1), x.std(axis=1, ddof=1), n, boundary, plan.effect, two_sided)
        rows = np.flatnonzero(open_)[code != 0]
        outcome[rows], seeds[rows] = code[code != 0], n
        open_[rows] = False


def fixed_seeds_for_power(power: float, effect_sd: float, correlation: float = 0.0, level: float = ALPHA) -> int | None:
    """The seeds a fixed (one-look) paired t-test at `level` needs for `power` against the
    effect simulated above: the yardstick a sequential plan's mean seeds is compared with."""
    return seeds_needed(effect_sd, math.sqrt(2.0 * (1.0 - correlation)), level, power)
