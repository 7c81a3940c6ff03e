"""One eval's per-problem results and the summaries computed from them (numpy; no torch): what the
trainer logs after an eval and what the report reads back from evals.jsonl (or a re-scored
protocol's results, evals/<name>.jsonl), so both compute every number the same way.

    ProblemScores.correct   [P, n]: the verifier's score of each of the n samples of each problem
    ProblemScores.votes     per problem [correct votes, wrong class votes, ...] (maj@k), or None
    per_problem("pass", 8)  [P]: each problem's pass@8 estimate; its mean is the run's eval/pass@8
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_ablate.evals.protocol import ACCURACY, MAJ, PASS, EvalProtocol, parse_metric
from grpo_ablate.rundir.files import pack_scores, unpack_scores
from grpo_ablate.stats.pass_at_k import majority_at_k, pass_at_k_table, pass_at_k_variance


@dataclass(frozen=True)
class ProblemScores:
    """The scores of one eval: `set` fingerprints its problems (their prompts), `correct` is
    [problems, samples], `votes` the maj@k tallies (None: the task parses no answers, or one sample)."""
    set: str
    correct: np.ndarray
    votes: tuple | None = None

    @property
    def problems(self) -> int:
        return self.correct.shape[0]

    @property
    def samples(self) -> int:
        return self.correct.shape[1]

    def counts(self) -> np.ndarray:
        """[P] int: the correct samples of each problem (a score of 1: the verifier's pass)."""
        return (self.correct >= 1.0).sum(axis=1)

    def has(self, kind: str, k: int | None) -> bool:
        """Whether this eval can give the metric: pass@k and maj@k need k <= its samples (maj@k votes too)."""
        if kind == "avg":
            return True
        if k is None or not 1 <= k <= self.samples:
            return False
        return kind == PASS or (kind == MAJ and self.votes is not None)

    def per_problem(self, kind: str, k: int | None = None) -> np.ndarray:
        """[P] float64: each problem's avg@n, pass@k or maj@k estimate (stats/pass_at_k.py)."""
        if kind == "avg":
            return self.correct.mean(axis=1).astype(float)
        if not self.has(kind, k):
            raise ValueError(f"{kind}@{k} from {self.samples} sample(s) per problem"
                             + (" without votes" if kind == MAJ and self.votes is None else ""))
        if kind == PASS:
            return pass_at_k_table(self.samples, k)[self.counts()]
        return np.array([majority_at_k(v, self.samples, k) for v in self.votes], dtype=float)

    def value(self, kind: str, k: int | None = None) -> float:
        return float(self.per_problem(kind, k).mean())

    def sampling_variance(self, kind: str, k: int | None = None) -> float | None:
        """An unbiased estimate of the variance of this eval's mean (the run's number) over the draw of
        its samples, the policy held fixed: Σ_j v̂_j / P² with v̂_j the per-problem estimator's
        (pass_at_k_variance; avg@n is pass@1). None where none exists (maj@k; pass@k with 2k > n)."""
        if kind == "avg":
            kind, k = PASS, 1
        if kind != PASS or k is None or 2 * k > self.samples:
            return None
        table = np.array([pass_at_k_variance(self.samples, c, k) for c in range(self.samples + 1)])
        return float(table[self.counts()].sum() / self.problems ** 2)

    def summaries(self, protocol: EvalProtocol) -> dict:
        """metrics.jsonl's eval columns under a resolved protocol: eval/accuracy, eval/pass@k, eval/maj@k."""
        out = {ACCURACY: self.value("avg")}
        for k in protocol.pass_k or ():
            out[f"eval/pass@{k}"] = self.value(PASS, k)
        for k in protocol.maj_k or ():
            if self.votes is not None:
                out[f"eval/maj@{k}"] = self.value(MAJ, k)
        return out

    def row(self, step: int) -> dict:
        """This eval as a row of evals.jsonl (rundir.pack_scores; the tallies as they are)."""
        return {"step": int(step), "set": self.set, **pack_scores(self.correct.reshape(-1).tolist(), self.samples),
                **({"votes": [list(map(int, v)) for v in self.votes]} if self.votes is not None else {})}

    def metric(self, name: str) -> np.ndarray | None:
        """[P] per-problem values of a metric by its name (`eval/pass@8`), None when this eval has none."""
        parsed = parse_metric(name)
        if parsed is None or not self.has(*parsed):
            return None
        return self.per_problem(*parsed)


def tally_votes(answers: list, correct: list[bool]) -> list[int]:
    """One problem's vote tallies from its samples' parsed answers (None: no answer, an abstention)
    and whether each was correct: [correct votes, then each wrong answer's votes, most first]."""
    right, wrong = 0, {}
    for answer, ok in zip(answers, correct):
        if answer is None:
            continue
        if ok:
            right += 1
        else:
            wrong[answer] = wrong.get(answer, 0) + 1
    return [right, *sorted(wrong.values(), reverse=True)]


def read_row(row: dict) -> ProblemScores | None:
    """An evals.jsonl row as ProblemScores; None when it holds no scores; ValueError saying what is
    wrong when its scores are not scores (not numbers, outside [0, 1]) or its tallies not tallies."""
    try:
        flat = unpack_scores(row)
    except TypeError:
        raise ValueError("the per-problem scores are not numbers") from None
    except ValueError as err:
        raise ValueError(f"the per-problem scores are damaged: {err}") from None
    if flat is None:
        return None
    samples = int(row.get("samples", 1))
    correct = np.asarray(flat, float).reshape(-1, samples)
    if not (np.isfinite(correct).all() and ((correct >= 0.0) & (correct <= 1.0)).all()):
        raise ValueError("a per-problem score is not a number in [0, 1]")
    votes = row.get("votes")
    if votes is not None:
        if not (isinstance(votes, list) and len(votes) == len(correct) and all(
                isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
                and sum(v) <= samples for v in votes)):
            raise ValueError(f"`votes` is not one tally of at most {samples} votes per problem")
        votes = tuple(tuple(v) for v in votes)
    return ProblemScores(str(row.get("set")), correct, votes)


def read_evals(rows: list[dict]) -> tuple[dict, str | None]:
    """({step: ProblemScores}, what is wrong) from evals.jsonl rows: scores that are not numbers,
    outside [0, 1] or not finite, tallies that are not tallies, or one eval set's problems counted
    two ways (the report leaves such a run out: report/schema.py)."""
    evals, sizes = {}, {}
    for row in rows:
        if not isinstance(row.get("step"), int):
            continue
        try:
            scores = read_row(row)
        except ValueError as err:
            return {}, f"step {row['step']}: {err}"
        if scores is None:
            continue
        if sizes.setdefault(scores.set, scores.problems) != scores.problems:
            return {}, (f"eval set {scores.set!r} has {sizes[scores.set]} problems in one eval and {scores.problems} "
                        f"at step {row['step']}")
        evals[row["step"]] = scores
    return evals, None


def paired_sampling_variance(a: list, b: list) -> float | None:
    """The variance, over the draw of the eval's samples (the policies fixed), of Δ = a's number − b's,
    each the mean correctness over the evals `a` / `b` (one seed's summary: its final eval, or its last k)
    of their problems and samples: Σ over evals and problems of s²_j / n, over (k P)², with s²_j the
    variance (ddof 1) of the paired per-sample differences of problem j. Sample i of a problem is paired
    with sample i of the other side: both were drawn with the same row's uniforms (evals/score.py), so
    their covariance is counted, not assumed away. None unless both sides have n >= 2 samples of the
    same problems at every eval."""
    if not a or len(a) != len(b):
        return None
    total = 0.0
    for x, y in zip(a, b):
        if x.correct.shape != y.correct.shape or x.samples < 2:
            return None
        d = x.correct - y.correct
        total += float(d.var(axis=1, ddof=1).sum()) / x.samples / x.problems ** 2
    return total / len(a) ** 2
