"""Verifiable tasks. A task gives prompts with reference solutions and scores completions.

The trainer needs only this protocol:
    task.train_batch(n, seed, step) -> list[Problem]   # deterministic in (seed, step)
    task.eval_set() -> list[Problem]                    # held out, fixed
    task.warmup_batch(n, rng) -> list[Problem]          # for the supervised warm start
    task.reward(completion: str, problem) -> float      # 1.0 correct, 0.0 otherwise
    task.chars -> str                                   # characters the embedded tokenizer needs
"""
from __future__ import annotations

from grpo_ablate.tasks.arithmetic import ArithmeticTask, Problem

TASKS = {"arithmetic": ArithmeticTask}


def build_task(cfg) -> ArithmeticTask:
    """Instantiate the task named by `cfg.name` with the rest of the group as arguments."""
    params = {k: v for k, v in dict(cfg).items() if k != "name"}
    return TASKS[cfg.name](**params)


__all__ = ["TASKS", "ArithmeticTask", "Problem", "build_task"]
