"""Short chat questions with a number for an answer, for a real (small) chat model: task=quiz.

    kind=add      "What is 3 + 5? Answer with the number only."                       -> 8
    kind=larger   "Which is larger, 47 or 62? Answer with the number only."           -> 62
    kind=count    "How many times does the letter 'r' appear in the word 'cherry'? ..." -> 2

The prompt is the user turn of the model's chat template (task.chat_template=auto). The
reward is 1 when the last integer of the reply is the answer: a chat model tends to restate
the question first ("3 + 5 = 8"), so the first integer would score the question, not the
answer (SmolLM2-135M-Instruct, greedy: 0.06 with the first, 0.60 with the last on `add`,
docs/smollm2.md). Problems are generated from (seed, step), so a resumed run sees
the prompts an uninterrupted one would.

The eval problems are held out by construction, as the arithmetic task's (holdout.py): each
kind holds out its problems of smallest prompt hash, EVAL_SHARE of them but never fewer than
MIN_HELD_OUT (add: 64 of its 100, count: 64 of 158, larger: 2,003 of 8,010), so the default
eval_size fits every kind. Training draws from the rest whatever eval_size is; the eval set is
the first eval_size held-out problems in hash order (a larger eval keeps a smaller one's).
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from grpo_ablate.tasks.holdout import EVAL_SHARE, prompt_fraction

KINDS = ("add", "larger", "count")
WORDS = ("apple", "banana", "cherry", "strawberry", "raspberry", "blueberry", "pineapple", "orange", "mango",
         "papaya", "coconut", "watermelon", "lemon", "grapefruit", "kiwi", "peach", "apricot", "tomato",
         "avocado", "blackberry", "cranberry", "gooseberry", "mulberry", "persimmon", "pomegranate", "tangerine")
_INTEGER = re.compile(r"-?\d+")
# The default task.eval_size (conf/task/quiz.yaml): a kind holds out at least this many, so it
# fits every kind, also add's 100 problems, where a quarter would be 25.
MIN_HELD_OUT = 64


@dataclass(frozen=True)
class QuizProblem:
    prompt: str
    answer: int


def last_integer(text: str) -> int | None:
    """The last integer in `text` (None: there is none)."""
    found = _INTEGER.findall(text)
    try:
        return int(found[-1]) if found else None
    except ValueError:   # more digits than int() reads (4300): a wrong answer, never a crash in the reward
        return None


class QuizTask:
    CHOICES = {"kind": KINDS}   # what `sweep --family task.X` crosses

    def __init__(self, kind: str = "add", eval_size: int = MIN_HELD_OUT, chat_template: str = "auto",
                 system_prompt: str | None = None, max_prompt_tokens: int | None = None):
        if kind not in KINDS:
            raise ValueError(f"task.kind={kind!r} is not allowed; allowed: {', '.join(KINDS)}")
        if not isinstance(eval_size, int) or eval_size < 1:
            raise ValueError(f"task.eval_size={eval_size!r} is not allowed; it must be an integer >= 1")
        if chat_template not in ("auto", "none"):
            raise ValueError(f"task.chat_template={chat_template!r} is not allowed; allowed: auto, none")
        self.kind, self.eval_size = kind, eval_size
        self.chat_template, self.system_prompt, self.max_prompt_tokens = chat_template, system_prompt, max_prompt_tokens
        universe = self._universe()
        by_hash = sorted(range(len(universe)), key=lambda i: prompt_fraction(universe[i].prompt))
        held = set(by_hash[:max(math.ceil(EVAL_SHARE * len(universe)), MIN_HELD_OUT)])
        if eval_size > len(held):
            raise ValueError(f"task.eval_size={eval_size} is more than the {len(held)} held-out problems of "
                             f"task.kind={kind} (of its {len(universe)}); lower it")
        self.eval = [universe[i] for i in by_hash[:eval_size]]
        self.train = [p for i, p in enumerate(universe) if i not in held]   # in the universe's order

    def _universe(self) -> list[QuizProblem]:
        """Every distinct problem of the kind, in a fixed order (100, 8010 and a few hundred)."""
        tail = " Answer with the number only."
        if self.kind == "add":
            return [QuizProblem(f"What is {a} + {b}?{tail}", a + b) for a in range(10) for b in range(10)]
        if self.kind == "larger":
            return [QuizProblem(f"Which is larger, {a} or {b}?{tail}", max(a, b))
                    for a in range(10, 100) for b in range(10, 100) if a != b]
        return [QuizProblem(f"How many times does the letter '{c}' appear in the word '{w}'?{tail}", w.count(c))
                for w in WORDS for c in sorted(set(w))]

    # -- the task protocol --------------------------------------------------------------
    def train_batch(self, n: int, seed: int, step: int, round: int = 0) -> list[QuizProblem]:
        """Prompts of optimizer step `step` (sampling round `round`): a pure function of them."""
        rng = random.Random(f"quiz/train/{self.kind}/{seed}/{step}" + (f"/{round}" if round else ""))
        return [self.train[rng.randrange(len(self.train))] for _ in range(n)]

    def eval_set(self) -> list[QuizProblem]:
        return self.eval

    def reward(self, completion: str, problem: QuizProblem) -> float:
        return 1.0 if last_integer(completion) == problem.answer else 0.0

    def answer(self, completion: str) -> int | None:
        """The answer a completion commits to (what maj@k votes on), None for none."""
        return last_integer(completion)

    def drop_prompts(self, too_long) -> tuple[int, int]:
        """task.max_prompt_tokens: remove the problems `too_long` says are (counts: train, eval)."""
        before = len(self.train), len(self.eval)
        self.train = [p for p in self.train if not too_long(p)]
        self.eval = [p for p in self.eval if not too_long(p)]
        return before[0] - len(self.train), before[1] - len(self.eval)

    def describe(self) -> dict:
        return {"name": "quiz", "kind": self.kind, "train": len(self.train), "eval": len(self.eval)}
