"""Math problems from data: a JSONL file (task=jsonl), a parquet file (task=parquet) or a
Hugging Face dataset (task=hf), scored by math-verify (see math_answer.py). A bad row is an error
naming it, never dropped; the eval set is held out by a hash of the question (holdout.py) or a
separate file/split, and `shuffle_seed` orders it, never chooses it; training walks epoch-wise
shuffles, so a resumed run sees what an uninterrupted one would.
Design: docs/real-models.md#data-what-is-held-out-and-in-which-order
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from grpo_ablate.errors import ConfigError
from grpo_ablate.tasks.holdout import EVAL_SHARE, held_out
from grpo_ablate.tasks.math_answer import MathVerifier, extract_answer, gold_answer


@dataclass(frozen=True)
class MathProblem:
    prompt: str                    # the question in task.prompt_template (before any chat template)
    answer: str                    # the gold final answer, e.g. "1/2"
    difficulty: str | None = None
    where: str = ""                # the row it came from, e.g. "data.jsonl line 12"
    question: str = ""             # the question as read (stripped): what the eval partition hashes


class DatasetTask:
    """Shared by the jsonl, parquet and hf tasks: they differ only in how rows are read."""

    def __init__(self, question_field: str = "question", answer_field: str = "answer",
                 difficulty_field: str | None = None, difficulties=None,
                 prompt_template: str = "{question}", eval_size: int | None = 100, shuffle_seed: int = 0,
                 format_reward: float = 0.0, chat_template: str = "auto", system_prompt: str | None = None,
                 max_prompt_tokens: int | None = None):
        for key, value in (("question_field", question_field), ("answer_field", answer_field)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"task.{key}={value!r} is not allowed; it must be a field name")
        if "{question}" not in str(prompt_template):
            raise ValueError(f"task.prompt_template={prompt_template!r} must contain {{question}}")
        if chat_template not in ("auto", "none"):
            raise ValueError(f"task.chat_template={chat_template!r} is not allowed; allowed: auto, none")
        if eval_size is not None and (not isinstance(eval_size, int) or eval_size < 1):
            raise ValueError(f"task.eval_size={eval_size!r} is not allowed; it must be an integer >= 1 "
                             "(or null: all of eval_path / eval_split)")
        if max_prompt_tokens is not None and (not isinstance(max_prompt_tokens, int) or max_prompt_tokens < 1):
            raise ValueError(f"task.max_prompt_tokens={max_prompt_tokens!r} is not allowed; it must be an "
                             "integer >= 1 (or null: no limit)")
        if not isinstance(format_reward, (int, float)) or format_reward < 0:
            raise ValueError(f"task.format_reward={format_reward!r} is not allowed; it must be a number >= 0")
        self.question_field, self.answer_field = question_field, answer_field
        self.difficulty_field = difficulty_field
        self.difficulties = None if difficulties is None else [str(d) for d in difficulties]
        self.prompt_template, self.eval_size, self.shuffle_seed = str(prompt_template), eval_size, shuffle_seed
        self.format_reward = float(format_reward)
        self.chat_template, self.system_prompt, self.max_prompt_tokens = chat_template, system_prompt, max_prompt_tokens
        self.train: list[MathProblem] = []
        self.eval: list[MathProblem] = []
        self._epochs: dict[tuple[int, int], list[int]] = {}

    # -- reading (subclasses: _train_rows, _eval_rows -> (label, [(where, row), ...]) or None) ----
    def load(self) -> "DatasetTask":
        """Read, check and split the rows (ConfigError naming every malformed row)."""
        self.verifier = MathVerifier()
        label, rows = self._train_rows()
        problems = self._problems(label, rows)
        eval_file = self._eval_rows()
        if eval_file is not None:
            self.train = problems
            eval_label, eval_rows = eval_file
            self.eval = self._shuffled(self._problems(eval_label, eval_rows))[:self.eval_size]
            return self
        held = [p for p in problems if held_out(p.question)]
        self.train = [p for p in problems if not held_out(p.question)]
        why = f"a row is held out when a hash of its question falls in a fixed {EVAL_SHARE:.0%}"
        if not held or (self.eval_size is not None and self.eval_size > len(held)):
            asked = "null (all held-out problems)" if self.eval_size is None else self.eval_size
            raise ConfigError(f"task.eval_size={asked} is more than the {len(held)} held-out problems of "
                              f"{label} ({why}); lower it or give a held-out file or split (task.eval_path, "
                              "task.eval_split)")
        if not self.train:
            raise ConfigError(f"{label}: all its {len(problems)} rows are held out ({why}), none is left to "
                              "train on; give more rows")
        self.eval = self._shuffled(held)[:self.eval_size]
        return self

    def _shuffled(self, problems: list) -> list:
        problems = list(problems)
        random.Random(f"split/{self.shuffle_seed}").shuffle(problems)
        return problems

    def _problems(self, label: str, rows) -> list[MathProblem]:
        rows = list(rows)
        if not rows:
            raise ConfigError(f"{label} has no rows")
        first = next((row for _, row in rows if isinstance(row, dict)), None)
        for key in ("question_field", "answer_field", "difficulty_field"):
            field = getattr(self, key)
            if field is not None and first is not None and field not in first:
                raise ConfigError(f"task.{key}={field!r} is not a field of {label} (its rows have: "
                                  f"{', '.join(map(str, first))})")
        problems, bad = [], []
        for where, row in rows:
            problem, error = self._problem(where, row)
            if error:
                bad.append(f"{where}: {error}")
            elif self.difficulties is None or problem.difficulty in self.difficulties:
                problems.append(problem)
        if bad:
            shown = "; ".join(bad[:5]) + (f"; ... ({len(bad) - 5} more)" if len(bad) > 5 else "")
            raise ConfigError(f"{label}: {len(bad)} malformed row{'s' * (len(bad) > 1)}: {shown}")
        if not problems:
            raise ConfigError(f"{label}: no rows with task.difficulties={self.difficulties}")
        return problems

    def _problem(self, where: str, row) -> tuple[MathProblem | None, str | None]:
        if not isinstance(row, dict):
            return None, f"not an object ({type(row).__name__})"
        question, answer = row.get(self.question_field), row.get(self.answer_field)
        if not isinstance(question, str) or not question.strip():
            return None, f"'{self.question_field}' is missing or not a non-empty string"
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or not str(answer).strip():
            return None, f"'{self.answer_field}' is missing, empty, or not a string or number"
        gold = gold_answer(str(answer))
        if not self.verifier.gold(gold):
            return None, f"'{self.answer_field}' {gold!r} is not an answer math-verify can read"
        difficulty = row.get(self.difficulty_field) if self.difficulty_field else None
        prompt = self.prompt_template.replace("{question}", question.strip())
        return MathProblem(prompt, gold, None if difficulty is None else str(difficulty), where,
                           question.strip()), None

    # -- the task protocol --------------------------------------------------------------------
    def train_batch(self, n: int, seed: int, step: int, round: int = 0) -> list[MathProblem]:
        if round:
            rng = random.Random(f"train/{seed}/{step}/{round}")
            return [self.train[rng.randrange(len(self.train))] for _ in range(n)]
        start = (step - 1) * n
        return [self.train[self._epoch(seed, (start + i) // len(self.train))[(start + i) % len(self.train)]]
                for i in range(n)]

    def prompt_pool(self, size: int | None, seed: int) -> list[MathProblem]:
        """The training set (size None), or the first `size` problems of a seeded shuffle of it."""
        if size is None or size >= len(self.train):
            return list(self.train)
        order = list(range(len(self.train)))
        random.Random(f"pool/{seed}").shuffle(order)
        return [self.train[i] for i in order[:size]]

    def _epoch(self, seed: int, epoch: int) -> list[int]:
        """The order of the training problems in one epoch (a seeded shuffle)."""
        if (seed, epoch) not in self._epochs:
            order = list(range(len(self.train)))
            random.Random(f"epoch/{seed}/{epoch}").shuffle(order)
            self._epochs = {(seed, epoch): order}   # one epoch at a time is all a run needs
        return self._epochs[(seed, epoch)]

    def eval_set(self) -> list[MathProblem]:
        return self.eval

    def reward(self, completion: str, problem: MathProblem) -> float:
        """1 if the completion's final answer equals the gold answer (math-verify), else 0."""
        return 1.0 if self.verifier.correct(completion, problem.answer) else 0.0

    def answer(self, completion: str) -> str | None:
        """The final answer a completion gives (what maj@k votes on), as written, spaces dropped; None
        for none. Two wrong answers that math-verify would call equal but are written differently
        ("0.5", "1/2") vote apart; every correct one votes with the others (evals/scores.py)."""
        found, _ = extract_answer(completion)
        return None if found is None else "".join(found.split())

    def formatted(self, completion: str) -> bool:
        """The final answer is in an explicit form (\\boxed{} or ####), for task.format_reward."""
        return extract_answer(completion)[1] in ("boxed", "gsm8k")

    def drop_prompts(self, too_long) -> tuple[int, int]:
        """Remove problems whose prompt `too_long` rejects; (train, eval) counts removed."""
        train = [p for p in self.train if not too_long(p)]
        eval_ = [p for p in self.eval if not too_long(p)]
        dropped = (len(self.train) - len(train), len(self.eval) - len(eval_))
        if not train:
            raise ConfigError(f"all {len(self.train)} training prompts are longer than "
                              f"task.max_prompt_tokens={self.max_prompt_tokens}")
        self.train, self.eval, self._epochs = train, eval_, {}
        return dropped

    def describe(self) -> dict:
        return {"name": self.name, "train": len(self.train), "eval": len(self.eval)}


def _existing(key: str, path) -> Path:
    if path is None or str(path) in ("", "???"):
        raise ValueError(f"task.{key} is required: a file of problems")
    resolved = Path(os.path.expanduser(str(path)))
    if not resolved.is_file():
        raise ValueError(f"task.{key}={str(path)!r} does not exist (or is not a file)")
    return resolved


def _held_out(path: Path, eval_path) -> Path | None:
    """task.eval_path, which must be another file than the training one: the eval would score problems the
    policy trains on."""
    if eval_path is None:
        return None
    resolved = _existing("eval_path", eval_path)
    if resolved.resolve() == path.resolve():
        raise ValueError(f"task.eval_path={str(eval_path)!r} is the training file (task.path): the eval would score "
                         "problems the policy trains on; give a held-out file, or leave it null (a split is held out)")
    return resolved


def _utf8(key: str, path: Path) -> Path:
    """A JSONL file that decodes as UTF-8, checked before a run dir exists (rows are read later)."""
    try:
        path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"task.{key}={str(path)!r} is not UTF-8 text (byte {err.start}: {err.reason}); save it "
                         "as UTF-8") from None
    return path


def _read_jsonl(path: Path) -> list[tuple[str, object]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append((f"line {number}", json.loads(line)))
            except json.JSONDecodeError as err:
                rows.append((f"line {number}", _Malformed(f"not valid JSON ({err.msg})")))
    return rows


class _Malformed(str):
    """A row that could not even be decoded: reported like any other malformed row."""


class JsonlTask(DatasetTask):
    """task=jsonl: one JSON object per line."""
    name = "jsonl"
    reads_local_files = True   # cheap to read: the config check reads its rows (malformed ones refused there)

    def __init__(self, path=None, eval_path=None, **options):
        self.path = _utf8("path", _existing("path", path))
        self.eval_path = _held_out(self.path, eval_path)
        if self.eval_path is not None:
            _utf8("eval_path", self.eval_path)
        super().__init__(**options)

    def _train_rows(self):
        return f"task.path={self.path}", _read_jsonl(self.path)

    def _eval_rows(self):
        return None if self.eval_path is None else (f"task.eval_path={self.eval_path}", _read_jsonl(self.eval_path))

    def _problem(self, where, row):
        if isinstance(row, _Malformed):
            return None, str(row)
        return super()._problem(where, row)


class ParquetTask(DatasetTask):
    """task=parquet: a parquet file (read with pandas + pyarrow); rows numbered from 1."""
    name = "parquet"
    reads_local_files = True

    def __init__(self, path=None, eval_path=None, **options):
        self.path = _existing("path", path)
        self.eval_path = _held_out(self.path, eval_path)
        super().__init__(**options)

    @staticmethod
    def _read(key: str, path: Path):
        import pandas as pd

        try:
            frame = pd.read_parquet(path)
        except ImportError:
            raise ConfigError("task=parquet needs pyarrow: pip install 'grpo-ablate[hf]'") from None
        except Exception as err:  # a corrupt or non-parquet file
            why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"task.{key}={str(path)!r} is not a readable parquet file: {why}") from None
        rows = frame.to_dict(orient="records")
        return f"task.{key}={path}", [(f"row {i}", _plain(row)) for i, row in enumerate(rows, start=1)]

    def _train_rows(self):
        return self._read("path", self.path)

    def _eval_rows(self):
        return None if self.eval_path is None else self._read("eval_path", self.eval_path)


class HFDatasetTask(DatasetTask):
    """task=hf: a Hugging Face dataset by hub name or local directory, through `datasets`. (The key
    is task.dataset: task.name is every config group's selector, here `hf`.)"""
    name = "hf"

    def __init__(self, dataset=None, subset=None, split: str = "train", eval_split: str | None = None, **options):
        if not dataset or str(dataset) == "???":
            raise ValueError("task.dataset is required with task=hf: a dataset on the hub (e.g. openai/gsm8k) "
                             "or a local directory of data files")
        self.dataset, self.subset, self.split, self.eval_split = str(dataset), subset, split, eval_split
        super().__init__(**options)

    def _load(self, split: str):
        try:
            import datasets
        except ImportError:
            raise ConfigError("task=hf needs the datasets package: pip install 'grpo-ablate[hf]'") from None
        datasets.disable_progress_bars()
        label = f"task.dataset={self.dataset}" + (f" subset {self.subset}" if self.subset else "") + f" split {split}"
        try:
            rows = datasets.load_dataset(self.dataset, self.subset, split=split)
        except Exception as err:  # offline and not cached, no such dataset, split or subset
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"{label} could not be loaded: {first}") from None
        return label, [(f"row {i}", _plain(row)) for i, row in enumerate(rows, start=1)]

    def _train_rows(self):
        return self._load(self.split)

    def _eval_rows(self):
        return None if self.eval_split is None else self._load(self.eval_split)


def _plain(row: dict) -> dict:
    """numpy scalars (parquet, arrow) as Python values, so type checks treat all sources alike."""
    return {k: v.item() if hasattr(v, "item") and getattr(v, "ndim", 1) == 0 else v for k, v in row.items()}
