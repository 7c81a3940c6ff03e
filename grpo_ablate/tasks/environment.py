"""Multi-turn tasks: an environment per episode, which answers the policy's turns and owns the reward.

The shape is the one users know from two trainers (the revisions read):
  - TRL GRPOTrainer's `environment_factory` (huggingface/trl d621f31, demo_grpo_environment.py): one
    environment object per example, `reset()` before the episode, tools as its methods, the reward
    read from the environment after the episode;
  - ms-swift's `MultiTurnScheduler` (modelscope/ms-swift 042caa3, swift/plugin/multi_turn.py):
    `step(request, result, current_turn)` answers a turn, `check_finished(...)` says when the
    episode ends (a turn cut by the length budget ends it), `max_turns` bounds it.

Here both are one protocol:

    task.environment(problem) -> Environment     # a fresh one per episode (TRL's factory)
    task.max_turns, task.turn_tokens             # the turn budget, the per-turn token budget
    env.stop -> tuple[str, ...]                  # texts that end a policy turn besides EOS (a tool call's close)
    env.tools -> list[dict]                      # JSON-schema tool specs (for a chat template; may be [])
    env.reset() -> None                          # before the first turn
    env.step(turn_text, turn) -> Reply           # the policy's turn (decoded) -> the environment's reply
    env.reward() -> float                        # after the episode (the environment owns it)

A `Reply` is the text appended to the trajectory (encoded once, appended as token ids: the policy's
own ids are never decoded and re-encoded), whether the episode ends, and the turn's outcome, a word
recorded per turn (`ok`, `answer`, `parse_error`, `tool_error`, ...), and optionally the turn's own
reward (a verifiable turn-level reward, e.g. 1 for a tool call that executed; summed over the
episode into its `turn_reward`, which the `turn_credit` family credits to the turns before the
first reply: tricks/turn_credit.py). A reply with a `role` (`tool`)
is a chat message: the tokenizer's chat template renders it (the close of the policy's turn, the
message, the next assistant header) and those ids are appended (sampling/chat_replies.py); without
one its text is appended as it is (the calculator's "2773;"). The environment says when the
episode ends, after an EOS turn too (a chat model closes a tool-call turn with its end-of-turn token);
a turn cut by the per-turn budget, the last turn of the turn budget and a tool that raises end it
whatever it says, recorded as `truncated`, `turn_budget` and `tool_error` (sampling/multi_turn.py).
Nothing a policy writes crashes a run.

A multi-turn task is otherwise a task (tasks/__init__.py): train_batch, eval_set, and
`reward(completion, problem)` on the whole transcript (policy turns and replies, as text), which
must agree with the environment's reward (rescoring and the controls read it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# what a turn's outcome may be: the environment's own words, and the driver's
OK, ANSWER, PARSE_ERROR, TOOL_ERROR, TRUNCATED, TURN_BUDGET = ("ok", "answer", "parse_error", "tool_error",
                                                              "truncated", "turn_budget")
# the outcomes that mean the turn got no usable reply (counted as failed turns)
FAILED = (PARSE_ERROR, TOOL_ERROR, TRUNCATED)


@dataclass(frozen=True)
class Reply:
    text: str                # appended after the policy's turn ("" for nothing)
    done: bool = False       # the episode ends after this turn
    outcome: str = OK        # recorded for the turn
    role: str | None = None  # a chat message of this role, rendered by the chat template; None: the text as it is
    reward: float | None = None   # the turn's own reward (a tool call that executed: MT-GRPO's turn-level
                                  # reward), summed per episode into `turn_reward`; None: the turn has none


class Environment(Protocol):
    stop: tuple[str, ...]
    tools: list[dict]

    def reset(self) -> None: ...

    def step(self, turn_text: str, turn: int) -> Reply: ...

    def reward(self) -> float: ...


def is_multi_turn(task) -> bool:
    """Whether a task's episodes are run through environments (it has `environment(problem)`)."""
    return callable(getattr(task, "environment", None))
