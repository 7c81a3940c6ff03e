"""Verifiable tasks. A task gives prompts with reference solutions and scores completions.

The trainer needs only this protocol:
    task.train_batch(n, seed, step) -> list[Problem]   # deterministic in (seed, step)
    task.eval_set() -> list[Problem]                    # held out, fixed (tasks/holdout.py)
    task.reward(completion: str, problem) -> float      # 1.0 correct, 0.0 otherwise
The embedded tiny model's warm start also needs (the arithmetic task has them):
    task.warmup_batch(n, rng) -> list[Problem]          # for the supervised warm start
    task.chars -> str                                   # characters the embedded tokenizer needs
For the prompt_pool family: task.prompt_pool(size, seed) -> list[Problem], a finite pool.
A multi-turn task adds `environment(problem)`, `max_turns` and `turn_tokens` (tasks/environment.py:
an environment per episode answers the policy's turns and owns the reward; `calculator` is one,
`tool_jsonl` the data task whose rows carry tool specs, through a chat template: tasks/tool_calls.py).
Optional: `answer(completion) -> hashable | None`, the final answer parsed (maj@k votes on it;
every task here has it); and, as the data tasks have them, `format_reward` (a bonus, with `formatted(completion)`),
`chat_template`, `system_prompt`, `max_prompt_tokens` (see grpo_ablate/sampling/prompts.py).
Every task holds its eval problems out by construction, a fixed partition by a hash of the
prompt: training draws (and the warm start) never depend on eval_size, and the eval set is a
prefix of a fixed ordering of the partition, so eval_size changes the eval alone.
"""
from __future__ import annotations

from grpo_ablate.tasks.arithmetic import ArithmeticTask, Problem
from grpo_ablate.tasks.calculator import CalculatorTask
from grpo_ablate.tasks.dataset import HFDatasetTask, JsonlTask, MathProblem, ParquetTask
from grpo_ablate.tasks.quiz import QuizProblem, QuizTask
from grpo_ablate.tasks.tool_calls import ToolHFTask, ToolJsonlTask, ToolParquetTask

TASKS = {"arithmetic": ArithmeticTask, "jsonl": JsonlTask, "parquet": ParquetTask, "hf": HFDatasetTask,
         "quiz": QuizTask, "calculator": CalculatorTask, "tool_jsonl": ToolJsonlTask, "tool_parquet": ToolParquetTask,
         "tool_hf": ToolHFTask}


def build_task(group):
    """Instantiate the task named by the task group's `name` (cfg.task, RunSpec.task) with the
    rest of the group as arguments, and read its data (data tasks: ConfigError naming any
    malformed row)."""
    from omegaconf import OmegaConf

    params = {k: v for k, v in OmegaConf.to_container(group, resolve=True).items() if k != "name"}
    task = TASKS[group.name](**params)
    return task.load() if hasattr(task, "load") else task


__all__ = ["TASKS", "ArithmeticTask", "CalculatorTask", "HFDatasetTask", "JsonlTask", "MathProblem", "ParquetTask",
           "Problem", "QuizProblem", "QuizTask", "ToolJsonlTask", "build_task"]
