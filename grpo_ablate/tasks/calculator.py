"""The embedded multi-turn task: multi-digit sums and products with a calculator tool.

    prompt        "47*59="
    policy turn   "[47*59]"        a tool call, closed by "]" (the turn's stop text)
    environment   "2773;"          the tool's result, appended as token ids
    policy turn   "2773"<eos>      the answer ends the episode

The transcript after the prompt is "[47*59]2773;2773"; the reward, at the end, is 1 when the
policy's last turn is the problem's answer. A call that does not parse (e.g. "[47*5"), a result
the tool refuses or a turn with no call and no number gets the reply "?;" (a recorded
`parse_error` / `tool_error` turn) and the policy may try again within the turn budget
(`max_turns`); the per-turn token budget (`turn_tokens`) cuts a turn that never closes. A call
turn has its own reward (`Reply.reward`: 1 when the tool computed, 0 when it did not), which the
`turn_credit` family can credit to it (tricks/turn_credit.py); the answer turn has none.

The tiny model cannot multiply two-digit numbers in its head: it must call the tool, copy the
operands into the call and copy the result into its answer. The warm start's demonstrations (the
policy's turns only: the tool's replies are not imitated) skip the tool on a share `slip_prob`
of the products and write a guess instead (the answer with its last digit off by one), a
systematic mistake the verifier's reward can find and fix: RL has to learn when to call.

Problems are held out for the eval by a hash of the prompt (tasks/holdout.py): training draws
and the warm start reject the partition; the eval set is the first `eval_size` distinct held-out
problems a fixed-key generator draws, so a larger eval keeps a smaller one's problems.
"""
from __future__ import annotations

import operator
import random
import re

from grpo_ablate.tasks.arithmetic import LEVELS, Problem
from grpo_ablate.tasks.environment import ANSWER, OK, PARSE_ERROR, TOOL_ERROR, Reply
from grpo_ablate.tasks.holdout import PARTITION, held_out

OPERATIONS = {"+": operator.add, "*": operator.mul}
CALL_OPEN, CALL_CLOSE, RESULT_END, UNKNOWN = "[", "]", ";", "?"
_CALL = re.compile(r"^\[(\d{1,6})([+*])(\d{1,6})\]$")
_ANSWER = re.compile(r"^\d{1,12}$")
# the tool refuses results longer than this (a reply the per-turn budget could not copy)
MAX_RESULT_DIGITS = 9
EVAL_DRAWS = 200_000

TOOL_SPEC = {"type": "function", "function": {
    "name": "calculator", "description": "The sum or the product of two non-negative integers.",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer"}, "op": {"type": "string", "enum": sorted(OPERATIONS)}, "b": {"type": "integer"}},
        "required": ["a", "op", "b"]}}}


def calculate(a: int, op: str, b: int) -> int | None:
    """The calculator tool: `a op b`, or None when it refuses (a result over MAX_RESULT_DIGITS digits)."""
    result = OPERATIONS[op](a, b)
    return result if len(str(result)) <= MAX_RESULT_DIGITS else None


def final_answer(transcript: str) -> int | None:
    """The integer the policy's last turn commits to: the text after the last tool result, when it
    is a number alone (a trailing tool call, or anything else, commits to nothing)."""
    last = transcript.rpartition(RESULT_END)[2].strip()
    return int(last) if _ANSWER.match(last) else None


class CalculatorEnvironment:
    """One episode of a calculator problem: answers tool calls, records the answer, owns the reward."""

    stop = (CALL_CLOSE,)
    tools = [TOOL_SPEC]

    def __init__(self, problem: Problem):
        self.problem = problem
        self.answer: int | None = None

    def reset(self) -> None:
        self.answer = None

    def step(self, turn_text: str, turn: int) -> Reply:
        text = turn_text.strip()
        if text.endswith(CALL_CLOSE):
            call = _CALL.match(text)
            if call is None:
                return Reply(UNKNOWN + RESULT_END, outcome=PARSE_ERROR, reward=0.0)
            result = calculate(int(call.group(1)), call.group(2), int(call.group(3)))
            if result is None:
                return Reply(UNKNOWN + RESULT_END, outcome=TOOL_ERROR, reward=0.0)
            return Reply(f"{result}{RESULT_END}", outcome=OK, reward=1.0)   # the call executed: its turn reward
        self.answer = int(text) if _ANSWER.match(text) else None
        return Reply("", done=True, outcome=ANSWER if self.answer is not None else PARSE_ERROR)

    def reward(self) -> float:
        return 1.0 if self.answer == self.problem.answer else 0.0


_EVAL_PAIRS: dict[tuple, tuple] = {}


class CalculatorTask:
    chars = "0123456789+*=[];?"
    CHOICES = {"level": tuple(LEVELS)}

    def __init__(self, level: str = "easy", eval_size: int = 200, max_turns: int = 3, turn_tokens: int = 12,
                 operations: str = "+*"):
        if level not in LEVELS:
            raise ValueError(f"task.level={level!r} is not one of {', '.join(LEVELS)}")
        for key, value in (("eval_size", eval_size), ("max_turns", max_turns), ("turn_tokens", turn_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"task.{key}={value!r} is not allowed; it must be an integer >= 1")
        if not operations or any(op not in OPERATIONS for op in str(operations)):
            raise ValueError(f"task.operations={operations!r} is not allowed; it must be a non-empty string of "
                             f"{', '.join(OPERATIONS)}")
        self.level, self.eval_size, self.operations = level, eval_size, str(operations)
        self.max_turns, self.turn_tokens = max_turns, turn_tokens
        self._eval = [self.make(*key) for key in self._eval_problems(eval_size)]

    # -- problems --------------------------------------------------------------------------
    def _operand(self, rng: random.Random) -> int:
        digits = rng.randint(*LEVELS[self.level])
        return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits - 1)

    def _triple(self, rng: random.Random) -> tuple[int, str, int]:
        a, b = self._operand(rng), self._operand(rng)
        return a, rng.choice(self.operations), b

    def make(self, a: int, op: str, b: int) -> Problem:
        answer = OPERATIONS[op](a, b)
        return Problem(prompt=f"{a}{op}{b}=", answer=answer,
                       solution=f"{CALL_OPEN}{a}{op}{b}{CALL_CLOSE}{answer}{RESULT_END}{answer}")

    def _draw(self, rng: random.Random, n: int) -> list[Problem]:
        out: list[Problem] = []
        while len(out) < n:
            a, op, b = self._triple(rng)
            if not held_out(f"{a}{op}{b}="):
                out.append(self.make(a, op, b))
        return out

    def _eval_problems(self, n: int) -> list[tuple[int, str, int]]:
        key = (self.level, self.operations, n)
        if key not in _EVAL_PAIRS:
            rng, found = random.Random(f"eval/calculator/{self.level}/{self.operations}"), {}
            for _ in range(EVAL_DRAWS):
                if len(found) == n:
                    break
                a, op, b = self._triple(rng)
                if f"{a}{op}{b}=" not in found and held_out(f"{a}{op}{b}="):
                    found[f"{a}{op}{b}="] = (a, op, b)
            if len(found) < n:
                raise ValueError(f"task.eval_size={n} is more than the {len(found)} held-out problems that "
                                 f"{EVAL_DRAWS} draws find at task.level={self.level}; lower it")
            _EVAL_PAIRS[key] = tuple(found.values())
        return list(_EVAL_PAIRS[key])

    # -- the task protocol -----------------------------------------------------------------
    def train_batch(self, n: int, seed: int, step: int, round: int = 0) -> list[Problem]:
        return self._draw(random.Random(f"train/calculator/{seed}/{step}/{round}"), n)

    def prompt_pool(self, size: int | None, seed: int) -> list[Problem]:
        if size is None:
            raise ValueError("the calculator task generates its problems: prompt_pool.size must be set")
        return self._draw(random.Random(f"pool/calculator/{seed}"), size)

    def eval_set(self) -> list[Problem]:
        return self._eval

    def environment(self, problem: Problem) -> CalculatorEnvironment:
        return CalculatorEnvironment(problem)

    def reward(self, completion: str, problem: Problem) -> float:
        """The environment's reward read off a transcript (policy turns and tool replies as text)."""
        return 1.0 if final_answer(completion) == problem.answer else 0.0

    def answer(self, completion: str) -> int | None:
        return final_answer(completion)

    # -- the warm start --------------------------------------------------------------------
    def warmup_batch(self, n: int, rng: random.Random) -> list[Problem]:
        return self._draw(rng, n)

    def demonstration_turns(self, problem: Problem, rng: random.Random, slip_prob: float = 0.0) -> list:
        """The warm start's target as (text, imitated) segments: the policy's turns are imitated, the
        tool's reply is context only. With probability `slip_prob` a product is answered without the
        tool, by a guess (its last digit off by one)."""
        call, _, rest = problem.solution.partition(CALL_CLOSE)
        reply, _, answer = rest.partition(RESULT_END)
        if "*" in problem.prompt and slip_prob > 0 and rng.random() < slip_prob:   # (no rng needed at 0: gold)
            guess = str(problem.answer)
            return [(guess[:-1] + str((int(guess[-1]) + 1) % 10), True)]
        return [(call + CALL_CLOSE, True), (reply + RESULT_END, False), (answer, True)]

    def demonstration(self, problem: Problem, rng: random.Random, slip_prob: float = 0.0) -> str:
        return "".join(text for text, _ in self.demonstration_turns(problem, rng, slip_prob))

    def describe(self) -> dict:
        return {"name": "calculator", "level": self.level, "operations": self.operations, "holdout": PARTITION,
                "demonstrations": "turns/v1"}
