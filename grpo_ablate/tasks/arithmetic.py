"""Verifiable multi-digit addition with a worked, variable-length trace.

    prompt      "471+59="
    completion  "1+9=10,7+5+1=13,4+1=5;530"      (then <eos>)

The trace adds column by column from the units, writing the carry as "+1"; the answer
follows the last ";". Completions range from a few characters ("3+4=7;7") to a few dozen,
so truncation, length penalties and length normalization have something to act on. With
`trace: false` the completion is the bare answer (benchmark W1's format).

Levels follow Tricks or Traps' easy / medium / hard split by operand size. Operands are
drawn by first choosing a digit count uniformly, so short problems are not drowned out by
the (far more numerous) long ones.

The eval problems are held out by construction (grpo_ablate/tasks/holdout.py): a quarter of
the problem space, chosen by a hash of the prompt. Training draws, prompt pools and the warm
start reject that partition, so they do not depend on `eval_size`; the eval set is the first
`eval_size` distinct problems of a fixed ordering of it (see `_eval_pairs`).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

from grpo_ablate.tasks.holdout import EVAL_SHARE, PARTITION, held_out

# (min digits, max digits) of each operand
LEVELS = {"easy": (1, 2), "medium": (1, 3), "hard": (2, 4)}

# Draws that order the eval partition before the rest of it follows in a shuffle (_draw_eval_pairs):
# enough that an eval of 2,000 of the easy level's 2,513 held-out problems is all in draw order.
EVAL_DRAWS = 200_000
# Problem spaces up to this many ordered pairs are enumerated to finish the ordering (medium's
# 10**6 takes about a second; only an eval_size past what EVAL_DRAWS find pays it).
ENUMERABLE = 10 ** 6

_ANSWER_AFTER_SEMICOLON = re.compile(r";\s*(-?\d+)\s*$")
_LAST_INTEGER = re.compile(r"(-?\d+)(?!.*\d)", re.S)


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: int
    solution: str  # reference completion, used for the supervised warm start only


def worked_trace(a: int, b: int) -> str:
    """Column-by-column addition trace, units first: 471+59 -> "1+9=10,7+5+1=13,4+1=5"."""
    da, db = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for i in range(max(len(da), len(db))):
        terms = [d[i] for d in (da, db) if i < len(d)]
        if carry:
            terms.append("1")
        column = sum(int(t) for t in terms)
        steps.append("+".join(terms) + f"={column}")
        carry = column // 10
    return ",".join(steps)


def parse_answer(completion: str) -> int | None:
    """The integer the completion commits to, or None.

    Robust to what a sampling policy produces: the text after the last ';' when the trace
    format is followed, else the last integer anywhere (so a bare "530" still counts).
    Trailing whitespace is ignored; anything else after the number means no answer.
    """
    text = completion.strip()
    match = _ANSWER_AFTER_SEMICOLON.search(text)
    if match is None:
        if ";" in text:
            return None  # a trace that ends in garbage after its ';' commits to nothing
        match = _LAST_INTEGER.search(text)
        if match is None or text[match.end():].strip():
            return None
    try:
        return int(match.group(1))
    except ValueError:   # more digits than int() reads (4300): no answer a problem here has, and never a crash
        return None

_EVAL_PAIRS: dict[tuple, tuple[tuple[int, int], ...]] = {}   # ArithmeticTask._eval_pairs's, by problem space and size


class ArithmeticTask:
    chars = "0123456789+=,;"
    CHOICES = {"level": tuple(LEVELS), "trace": (True, False)}   # what `sweep --family task.X` crosses

    def __init__(self, level: str = "easy", trace: bool = True, eval_size: int = 200,
                 operand_min: int | None = None, operand_max: int | None = None):
        if level not in LEVELS:
            raise ValueError(f"task.level={level!r} is not one of {', '.join(LEVELS)}")
        if not isinstance(trace, bool):
            raise ValueError(f"task.trace={trace!r} is not allowed; allowed: true, false")
        if isinstance(eval_size, bool) or not isinstance(eval_size, int) or eval_size < 1:
            raise ValueError(f"task.eval_size={eval_size!r} is not allowed; it must be an integer >= 1")
        for key, bound in (("operand_min", operand_min), ("operand_max", operand_max)):
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 0):
                raise ValueError(f"task.{key}={bound!r} is not allowed; it must be an integer >= 0 (or null)")
        self.level, self.trace, self.eval_size = level, trace, eval_size
        lo_digits, hi_digits = LEVELS[level]
        # explicit operand bounds (e.g. W1's 10..99) replace the level's digit counts
        self.operand_min = operand_min
        self.operand_max = operand_max
        self.digit_range = (lo_digits, hi_digits)
        values = self._values()
        if not values:
            raise ValueError(f"task.operand_min={operand_min} is above task.operand_max={operand_max}")
        if all(held_out(f"{a}+{b}=") for a in values for b in values):   # stops at the first training problem
            raise ValueError(f"every problem of {self._space_name()} is held out for the eval, none is left to "
                             "train on; widen task.operand_min..operand_max")
        self._eval = [self.make(a, b) for a, b in self._eval_pairs(eval_size)]

    # -- problem generation -------------------------------------------------------------
    def _operand(self, rng: random.Random) -> int:
        if self.operand_min is not None or self.operand_max is not None:
            values = self._values()
            return rng.randint(values.start, values.stop - 1)
        digits = rng.randint(*self.digit_range)
        return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)

    def _values(self) -> range:
        """Every value `_operand` can return (their ordered pairs are the problem space)."""
        lo, hi = self.digit_range
        if self.operand_min is not None or self.operand_max is not None:
            return range(self.operand_min or 0, (self.operand_max or 10 ** hi - 1) + 1)
        return range(0 if lo == 1 else 10 ** (lo - 1), 10 ** hi)

    def _space_name(self) -> str:
        values = self._values()
        if self.operand_min is not None or self.operand_max is not None:
            return f"operands {values.start}..{values.stop - 1}"
        return f"task.level={self.level}"

    def make(self, a: int, b: int) -> Problem:
        answer = a + b
        solution = f"{worked_trace(a, b)};{answer}" if self.trace else str(answer)
        return Problem(prompt=f"{a}+{b}=", answer=answer, solution=solution)

    def _draw(self, rng: random.Random, n: int) -> list[Problem]:
        """`n` training problems: the operand distribution outside the eval partition."""
        out: list[Problem] = []
        while len(out) < n:
            a, b = self._operand(rng), self._operand(rng)
            if not held_out(f"{a}+{b}="):
                out.append(self.make(a, b))
        return out

    def _eval_pairs(self, n: int) -> list[tuple[int, int]]:
        """`_draw_eval_pairs`, once per process for each problem space and size: a pure function of
        them that takes ~20 ms, and a sweep's plan builds a task for each variant to check it."""
        key = (self.level, self.operand_min, self.operand_max, n)
        if key not in _EVAL_PAIRS:
            _EVAL_PAIRS[key] = tuple(self._draw_eval_pairs(n))
        return list(_EVAL_PAIRS[key])

    def _draw_eval_pairs(self, n: int) -> list[tuple[int, int]]:
        """The operands of the eval set: the first `n` of a fixed ordering of the held-out problems,
        so a larger eval_size keeps a smaller one's problems (a prefix), and nothing else depends on n.

        The ordering: distinct held-out problems in the order a fixed-key generator first draws
        them from the operand distribution (an eval mixes short and long sums as training does,
        and a greedy eval gains nothing from scoring a problem twice). Near exhaustion such draws
        find the last rare problems slowly, so after EVAL_DRAWS draws the rest of the partition
        follows in a seeded shuffle. Refused in one line when the partition holds fewer than n."""
        rng = random.Random(f"eval/{self.level}/{self.operand_min}/{self.operand_max}")
        found: dict[str, tuple[int, int]] = {}
        for _ in range(EVAL_DRAWS):
            if len(found) == n:
                return list(found.values())
            a, b = self._operand(rng), self._operand(rng)
            prompt = f"{a}+{b}="
            if prompt not in found and held_out(prompt):
                found[prompt] = (a, b)
        if len(found) == n:
            return list(found.values())
        values, where = self._values(), self._space_name()
        if len(values) ** 2 > ENUMERABLE:
            raise ValueError(f"task.eval_size={n} is more than the {len(found)} held-out problems of {where} "
                             f"that {EVAL_DRAWS} draws find; lower it")
        rest = [(a, b) for a in values for b in values if f"{a}+{b}=" not in found and held_out(f"{a}+{b}=")]
        if len(found) + len(rest) < n:
            raise ValueError(f"task.eval_size={n} is more than the {len(found) + len(rest)} held-out problems "
                             f"of {where} ({EVAL_SHARE:.0%} of its problems, by a hash of the prompt); lower it")
        random.Random(f"eval-rest/{self.level}/{self.operand_min}/{self.operand_max}").shuffle(rest)
        return list(found.values()) + rest[:n - len(found)]

    # -- the task protocol --------------------------------------------------------------
    def train_batch(self, n: int, seed: int, step: int, round: int = 0) -> list[Problem]:
        """Prompts of optimizer step `step` (sampling round `round`): a pure function of its
        arguments, so a resumed run sees exactly the prompts an uninterrupted one would."""
        key = f"train/{seed}/{step}" + (f"/{round}" if round else "")
        return self._draw(random.Random(key), n)

    def prompt_pool(self, size: int | None, seed: int) -> list[Problem]:
        """A finite pool of `size` training problems (prompt_pool family), a pure function of
        (size, seed), outside the eval partition like every training draw."""
        if size is None:
            raise ValueError("the arithmetic task generates its problems: prompt_pool.size must be set")
        return self._draw(random.Random(f"pool/{seed}"), size)

    def warmup_batch(self, n: int, rng: random.Random) -> list[Problem]:
        """The supervised warm start's problems: training draws, so it never sees an eval problem
        and does not depend on eval_size."""
        return self._draw(rng, n)

    def demonstration(self, problem: Problem, rng: random.Random, slip_prob: float = 0.0) -> str:
        """The warm-up's target text: the reference solution, except that with probability
        `slip_prob` a problem whose last column carries is demonstrated with that carry
        forgotten in the final answer ("9+2=11;17" for 95+22=117).

        This imitates imperfect demonstrations: a warm-started policy that makes one
        systematic mistake, and that still samples the right answer often enough for a
        verifier-driven RL step to find and fix it within minutes on a CPU.
        """
        if not self.trace or slip_prob <= 0 or rng.random() >= slip_prob:
            return problem.solution
        trace, _, answer = problem.solution.rpartition(";")
        last_column = int(trace.rsplit("=", 1)[1])
        if last_column < 10 or len(answer) < 2:
            return problem.solution
        return f"{trace};{answer[1:].lstrip('0') or '0'}"

    def eval_set(self) -> list[Problem]:
        return self._eval

    def reward(self, completion: str, problem: Problem) -> float:
        return 1.0 if parse_answer(completion) == problem.answer else 0.0

    def answer(self, completion: str) -> int | None:
        """The answer a completion commits to (what maj@k votes on), None for none."""
        return parse_answer(completion)

    def describe(self) -> dict:
        """What defines the training distribution (part of the warm-start cache key): not
        eval_size, which changes the eval set only; the partition rule, which changes training."""
        return {"name": "arithmetic", "level": self.level, "trace": self.trace,
                "operand_min": self.operand_min, "operand_max": self.operand_max,
                "holdout": PARTITION}
