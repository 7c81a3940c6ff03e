"""Exact tests on 2x2 tables of run counts: Fisher's (two-sided, written out in exact integers)
and Boschloo's (one-sided: do runs break more often with a trick than without)."""
from __future__ import annotations

import math


def fisher_exact_p(table: list[list[int]]) -> float:
    """Fisher's exact test on a 2x2 table of counts, two-sided as scipy.stats.fisher_exact defines it:
    the hypergeometric probability of every table with these margins that is no likelier than the one
    seen (scipy's relative tolerance 1e-7 on "no likelier"). Written out in exact integers rather than
    imported: scipy.stats costs ~0.9 s to import, half a small report's time; tests/test_report_stats.py
    checks it against scipy on every table up to 12 runs an arm."""
    (a, b), (c, d) = table
    row, col, n = a + b, a + c, a + b + c + d
    weight = lambda k: math.comb(col, k) * math.comb(n - col, row - k)   # P(k) times C(n, row)
    seen = weight(a)
    tail = sum(w for k in range(max(0, row + col - n), min(row, col) + 1)
               if (w := weight(k)) * 10**7 <= seen * (10**7 + 1))
    return min(1.0, tail / math.comb(n, row))


def breaking_p(broke_with: int, done_with: int, broke_without: int, done_without: int) -> float | None:
    """One-sided exact p-value that runs break more often with the trick than without (Boschloo's
    test, uniformly more powerful than Fisher's); None when nothing broke or a side ran nothing."""
    if not done_with or not done_without or broke_with + broke_without == 0:
        return None
    table = [[broke_with, broke_without], [done_with - broke_with, done_without - broke_without]]
    from scipy import stats   # (only where a run broke: scipy.stats is slow to import, stats/student.py)

    return float(stats.boschloo_exact(table, alternative="greater").pvalue)
