"""Per-problem estimators of the sampled eval metrics, from the n samples drawn for one problem:

    avg@n   the mean correctness of the n samples (for n = 1 at temperature 0: greedy accuracy)
    pass@k  the chance that at least one of k samples is correct, for k <= n: the unbiased estimator
            of Chen et al. 2021 (arXiv 2107.03374, eq. 1), 1 − C(n − c, k) / C(n, k) with c correct
    maj@k   the chance that a majority vote over k samples picks a correct answer, for k <= n: the
            mean over all C(n, k) subsets of the vote's outcome (the tie rule below)

pass@k and maj@k at k < n are the averages over every k-subset of the n samples, so each is an
unbiased estimate of the metric a fresh draw of k samples would score. A run's number is the mean
of the per-problem estimates over the eval set (what `eval/pass@k` logs); the report's tests run
on those per-problem values (report/evidence.py).

The vote: each sample with a parsed answer votes for it; a sample without one abstains. Every
correct answer is one class (they all equal the gold answer), each distinct wrong answer a class of
its own. The correct class wins when it has strictly the most votes; a tie at the top among t
classes that includes it counts 1/t (the expected score of breaking the tie uniformly at random);
no vote at all scores 0. A problem's votes are given as [correct votes, wrong class 1, wrong class
2, ...]: abstentions are n minus their sum.

Everything here is exact arithmetic on integers (math.comb) until the final division, so it holds
for any n; `pass_at_k_table` is the vectorised form for a whole eval set.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np


def _check(n: int, k: int) -> None:
    if not (isinstance(n, (int, np.integer)) and isinstance(k, (int, np.integer)) and 1 <= k <= n):
        raise ValueError(f"k={k} samples of n={n}: need 1 <= k <= n")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al.'s unbiased pass@k of one problem with c of n samples correct: 1 − C(n−c, k)/C(n, k),
    as the product 1 − Π_{i=n−c+1..n} (1 − k/i) (their numpy form: no large binomials)."""
    _check(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"c={c} correct of n={n} samples")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def none_correct(n: int, c: int, j: int) -> float:
    """C(n−c, j) / C(n, j): the chance that j samples drawn without replacement from the n are all
    wrong; the unbiased estimator of (1 − p)^j for j <= n."""
    if n - c < j:
        return 0.0
    return math.prod((n - c - i) / (n - i) for i in range(j))


def pass_at_k_variance(n: int, c: int, k: int) -> float | None:
    """An unbiased estimate of the variance of `pass_at_k(n, c, k)` over the draw of the n samples
    (p, the problem's chance of a correct sample, fixed): with θ = 1 − (1 − p)^k,
    Var = E[θ̂²] − θ², and θ² = 1 − 2(1 − p)^k + (1 − p)^{2k} has the unbiased estimate
    1 − 2·C(n−c, k)/C(n, k) + C(n−c, 2k)/C(n, 2k); so θ̂² minus that. It needs 2k <= n (None
    otherwise: no unbiased estimate exists from fewer samples). For k = 1 it is the binomial
    c(n − c) / (n²(n − 1)). Unbiased, so one problem's value can fall below 0; sums over many are
    what it is for."""
    _check(n, k)
    if 2 * k > n:
        return None
    estimate = pass_at_k(n, c, k)
    return estimate ** 2 - (1.0 - 2.0 * none_correct(n, c, k) + none_correct(n, c, 2 * k))


def pass_at_k_table(n: int, k: int) -> np.ndarray:
    """[n + 1] float64: pass@k for c = 0..n correct (index by a problem's count of correct samples)."""
    _check(n, k)
    return np.array([pass_at_k(n, c, k) for c in range(n + 1)])


def majority_at_k(votes: Sequence[int], n: int, k: int) -> float:
    """maj@k of one problem (module docstring): `votes` = [correct votes, wrong class votes, ...] of
    its n samples (abstentions: n − sum), averaged exactly over every k-subset of the n samples."""
    _check(n, k)
    votes = tuple(int(v) for v in votes)
    if not votes or min(votes) < 0 or sum(votes) > n:
        raise ValueError(f"votes {list(votes)} of n={n} samples: need counts >= 0 that sum to at most n")
    correct, wrong = votes[0], tuple(sorted((v for v in votes[1:] if v > 0), reverse=True))
    return float(_majority(correct, wrong, n - sum(votes), k) / math.comb(n, k))


@functools.lru_cache(maxsize=65536)
def _majority(correct: int, wrong: tuple, abstain: int, k: int) -> Fraction:
    """Σ over the k-subsets of the correct class's share of the win, exactly: for each x correct votes
    drawn, the other k − x draws come from the wrong classes (each fewer than x, or exactly x: a tie)
    and the abstentions; `by_ties[t]` counts the subsets with t wrong classes tied at the top."""
    by_ties = [0] * (len(wrong) + 1)
    for x in range(1, min(correct, k) + 1):
        rest = k - x
        # ways[r][t]: r draws from the wrong classes seen so far, t of them drawn exactly x times
        ways = [[0] * (len(wrong) + 1) for _ in range(rest + 1)]
        ways[0][0] = 1
        for size in wrong:
            grown = [[0] * (len(wrong) + 1) for _ in range(rest + 1)]
            for r in range(rest + 1):
                for t, count in enumerate(ways[r]):
                    if count:
                        for j in range(min(size, x, rest - r) + 1):
                            grown[r + j][t + (j == x)] += count * math.comb(size, j)
            ways = grown
        for r in range(max(0, rest - abstain), rest + 1):   # the abstentions fill the rest of the subset
            for t, count in enumerate(ways[r]):
                by_ties[t] += math.comb(correct, x) * count * math.comb(abstain, rest - r)
    return sum((Fraction(count, 1 + t) for t, count in enumerate(by_ties)), Fraction(0))
