"""Math problems from data (task=jsonl|parquet|hf): answer extraction, math-verify scoring,
malformed rows reported by line, deterministic splits, prompts (chat template, length limit)."""
import json
import os
import re
import tempfile

import pytest

from conftest import REPO, cli
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.models import build_char_tokenizer
from grpo_ablate.sampling.prompts import PromptEncoder
from grpo_ablate.tasks import build_task
from grpo_ablate.tasks.holdout import held_out
from grpo_ablate.tasks.math_answer import extract_answer, gold_answer, last_boxed

# `datasets` writes its cache at import-time paths: keep it out of the home directory
os.environ.setdefault("HF_DATASETS_CACHE", tempfile.mkdtemp(prefix="hf-datasets-"))

WORD_PROBLEMS = REPO / "tests" / "data" / "word_problems.jsonl"


def jsonl_task(*extra):
    return build_task(compose(["task=jsonl", f"task.path={WORD_PROBLEMS}", *extra]).task)


@pytest.mark.parametrize("text, answer, form", [
    (r"so the answer is \boxed{\frac{1}{2}}.", r"\frac{1}{2}", "boxed"),
    (r"\boxed{1} first, then \boxed{ {a}{b} }", "{a}{b}", "boxed"),        # the last one, nested braces
    (r"\boxed{\frac{1}{2}", "2", "number"),                                # never closed: fallback
    ("48/2 = 24 clips.\n#### 72", "72", "gsm8k"),
    ("I think 3 or maybe 0.5", "0.5", "number"),
    ("no idea", None, None),
])
def test_extract_answer(text, answer, form):
    assert extract_answer(text) == (answer, form)


def test_gold_answer_reads_the_field():
    assert gold_answer("step one\n#### 1,000") == "1,000"
    assert gold_answer(r"The area is $\boxed{2\sqrt{2}}$.") == r"2\sqrt{2}"
    assert gold_answer(r"\frac{1}{2}") == r"\frac{1}{2}"     # no marker: the whole field
    assert last_boxed(r"\boxed 5 apples") == "5"


@pytest.mark.parametrize("completion, score", [
    (r"Half of it: \boxed{1/2}", 1.0), ("0.5", 1.0), ("so\n#### 0.5", 1.0), (r"\boxed{\dfrac{1}{2}}", 1.0),
    ("It is 1/2.", 1.0), (r"\boxed{0.6}", 0.0), ("#### 2", 0.0), ("", 0.0), ("no idea", 0.0),
])
def test_math_verify_scores_every_form_of_the_answer(tmp_path, completion, score):
    path = tmp_path / "half.jsonl"
    path.write_text("\n".join(json.dumps({"question": f"q{i}", "answer": "1/2"}) for i in range(3)) + "\n")
    task = build_task(compose(["task=jsonl", f"task.path={path}", "task.eval_size=1"]).task)
    assert task.reward(completion, task.train[0]) == score


def test_word_problems_load_split_and_score():
    task = jsonl_task("task.eval_size=8", "task.difficulty_field=difficulty")
    assert len(task.train) == 31 and len(task.eval) == 8           # 9 of the 40 rows are held out
    assert not {p.prompt for p in task.train} & {p.prompt for p in task.eval}     # held out
    assert jsonl_task("task.eval_size=8").eval == jsonl_task("task.eval_size=8").eval   # deterministic
    snail = next(p for p in task.train + task.eval if p.prompt.startswith("A snail"))
    assert snail.answer == "8" and snail.difficulty == "hard"                       # "#### 8" in the field
    assert task.reward(r"It gets out on day \boxed{8}.", snail) == 1.0
    assert task.reward("day 7", snail) == 0.0
    # an epoch visits every training problem once, in an order fixed by the seed
    epoch = [p for step in range(1, 32) for p in task.train_batch(1, seed=0, step=step)]   # 31 training rows
    assert sorted(p.prompt for p in epoch) == sorted(p.prompt for p in task.train)
    assert task.train_batch(4, seed=0, step=3) == task.train_batch(4, seed=0, step=3)
    assert task.train_batch(4, seed=1, step=1) != task.train_batch(4, seed=0, step=1)
    easy = jsonl_task("task.difficulty_field=difficulty", "task.difficulties=[easy]", "task.eval_size=2")
    assert {p.difficulty for p in easy.train + easy.eval} == {"easy"}
    assert task.formatted(r"\boxed{3}") and task.formatted("#### 3") and not task.formatted("3")


def test_the_held_out_rows_are_fixed_whatever_eval_size_is():
    """Without eval_path a fixed partition of the rows (by a hash of the question) is held
    out; eval_size takes the first of them in the shuffle_seed's order and moves no row into or out of
    training; a filter (task.difficulties) keeps each row on its side; more than the partition is one line."""
    everything = jsonl_task("task.eval_size=null", "task.difficulty_field=difficulty")
    few = jsonl_task("task.eval_size=3", "task.difficulty_field=difficulty")
    assert len(everything.eval) == 9 and few.eval == everything.eval[:3]
    assert few.train == everything.train and len(few.train) == 31
    assert all(held_out(p.question) for p in everything.eval) and not any(held_out(p.question) for p in few.train)
    for seed, step, round_ in ((0, 1, 0), (2, 9, 0), (1, 3, 2)):
        assert few.train_batch(4, seed, step, round_) == everything.train_batch(4, seed, step, round_)
    assert few.prompt_pool(10, seed=1) == everything.prompt_pool(10, seed=1)
    reordered = jsonl_task("task.eval_size=null", "task.difficulty_field=difficulty", "task.shuffle_seed=1")
    assert reordered.train == few.train and sorted(map(str, reordered.eval)) == sorted(map(str, everything.eval))
    assert reordered.eval != everything.eval                         # the seed orders the partition, never chooses it
    easy = jsonl_task("task.eval_size=null", "task.difficulty_field=difficulty", "task.difficulties=[easy]")
    assert {p.question for p in easy.eval} == {p.question for p in everything.eval if p.difficulty == "easy"}
    with pytest.raises(ConfigError, match="task.eval_size=10 is more than the 9 held-out problems of task.path=") \
            as err:
        jsonl_task("task.eval_size=10")
    assert "\n" not in str(err.value)


def test_a_held_out_file_stays_the_eval_and_everything_else_trains(tmp_path):
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(12)]
    train, held = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[:8]))
    held.write_text("".join(json.dumps(r) + "\n" for r in rows[8:]))
    task = lambda size: build_task(compose(["task=jsonl", f"task.path={train}", f"task.eval_path={held}",
                                            f"task.eval_size={size}"]).task)
    assert [p.question for p in task(2).train] == [r["question"] for r in rows[:8]]   # the partition is not applied
    assert {p.question for p in task("null").eval} == {r["question"] for r in rows[8:]}
    assert task(2).eval == task("null").eval[:2] and task(2).train == task(4).train


def test_malformed_rows_are_reported_with_their_line_numbers(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([
        json.dumps({"question": "What is 1+1?", "answer": "2"}),
        '{"question": "What is 2+2?", "answer": ',                  # line 2: cut off
        json.dumps({"question": "What is 3+3?", "answer": "6"}),
        json.dumps({"question": "What is 4+4?"}),                     # line 4: no answer
        "",                                                           # blank lines are fine
        json.dumps(["not", "an", "object"]),                         # line 6
        json.dumps({"question": "What is 5+5?", "answer": [10]}),     # line 7: not a string or number
    ]) + "\n")
    with pytest.raises(ConfigError) as err:
        build_task(compose(["task=jsonl", f"task.path={path}", "task.eval_size=1"]).task)
    message = str(err.value)
    assert "4 malformed rows" in message and "\n" not in message
    for line in ("line 2: not valid JSON", "line 4: 'answer' is missing", "line 6: not an object",
                 "line 7: 'answer' is missing, empty, or not a string or number"):
        assert line in message, message


def test_a_field_name_that_is_not_in_the_data_is_named(tmp_path):
    with pytest.raises(ConfigError, match=re.escape("task.question_field='problem' is not a field of task.path=")):
        jsonl_task("task.question_field=problem")


def test_parquet_and_local_hf_dataset_read_the_same_problems(tmp_path):
    import pandas as pd

    rows = [json.loads(line) for line in WORD_PROBLEMS.read_text().splitlines()]
    pd.DataFrame(rows).to_parquet(tmp_path / "problems.parquet")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "train.jsonl").write_text(WORD_PROBLEMS.read_text())
    reference = jsonl_task("task.eval_size=5")
    parquet = build_task(compose(["task=parquet", f"task.path={tmp_path / 'problems.parquet'}",
                                  "task.eval_size=5"]).task)
    hf = build_task(compose(["task=hf", f"task.dataset={tmp_path / 'hf'}", "task.eval_size=5"]).task)
    for task in (parquet, hf):
        assert [(p.prompt, p.answer) for p in task.train] == [(p.prompt, p.answer) for p in reference.train]
        assert [p.where for p in task.eval][:1] != [""]


def test_an_hf_dataset_that_is_not_there_is_one_clear_line():
    with pytest.raises(ConfigError, match=r"task.dataset=no-such-org/no-such-dataset split train could not be loaded"):
        build_task(compose(["task=hf", "task.dataset=no-such-org/no-such-dataset"]).task)


@pytest.mark.parametrize("overrides, needle", [
    (["task=jsonl", "task.path=/no/such/file.jsonl", "model=hf", "model.path=."],
     "task.path='/no/such/file.jsonl' does not exist"),
    (["task=jsonl", "model=hf", "model.path=."], "task.path is required"),
    (["task=hf", "model=hf", "model.path=."], "task.dataset is required"),
    (["task=jsonl", f"task.path={WORD_PROBLEMS}"], "task=jsonl needs a real model"),
    (["task=jsonl", f"task.path={WORD_PROBLEMS}", "model=hf", "model.path=.", "task.chat_template=always"],
     "task.chat_template='always' is not allowed"),
])
def test_bad_task_options(overrides, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        validate(compose(overrides))


@pytest.mark.full
def test_data_errors_are_one_line_exit_2_and_leave_no_run_dir(tmp_path):
    """A wrong field name is found when the data is read, after Hydra made the run dir."""
    model = tmp_path / "model"
    build_char_tokenizer("abc").save_pretrained(model)   # never loaded: the task fails first
    (model / "config.json").write_text("{}")
    work = tmp_path / "work"
    work.mkdir()
    for override in ("task.question_field=problem", "task.path=/no/such/file.jsonl"):
        out = cli("train", "model=hf", f"model.path={model}", "task=jsonl", f"task.path={WORD_PROBLEMS}", override,
                  "logger=none", f"hydra.run.dir={work}/run", cwd=work)
        assert out.returncode == 2, out.stderr[-2000:]
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: task."), out.stderr
        assert not any(work.iterdir())


class FakeTask:
    def __init__(self, **options):
        self.__dict__.update(options)


CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_prompt_encoder_chat_template_system_prompt_and_limit():
    from types import SimpleNamespace

    tok = build_char_tokenizer("".join(chr(c) for c in range(32, 127)) + "\n")
    question = SimpleNamespace(prompt="What is 1+1?")
    plain = PromptEncoder(tok, FakeTask(chat_template="auto"))
    assert tok.decode(plain(question)) == "What is 1+1?"                  # no template: raw text
    tok.chat_template = CHAT
    chat = PromptEncoder(tok, FakeTask(chat_template="auto", system_prompt="Be brief."))
    assert chat.text("What is 1+1?") == "<|system|>Be brief.\n<|user|>What is 1+1?\n<|assistant|>"
    assert tok.decode(chat(question)) == chat.text("What is 1+1?")
    assert PromptEncoder(tok, FakeTask(chat_template="none")).text("Q") == "Q"
    assert PromptEncoder(tok, FakeTask(chat_template="none", system_prompt="S")).text("Q") == "S\n\nQ"
    # the length limit drops problems once and counts them
    task = jsonl_task("task.eval_size=5", "task.max_prompt_tokens=80")
    said = []
    counts = PromptEncoder(tok, task).drop_long_prompts(task, said.append)
    long_ = [p for p in jsonl_task("task.eval_size=5").train if len(PromptEncoder(tok, task)(p)) > 80]
    assert counts["prompts/dropped"] == len(long_) > 0 and len(task.train) == 31 - len(long_)
    assert all(len(PromptEncoder(tok, task)(p)) <= 80 for p in task.train + task.eval)
    assert len(said) == 1 and "task.max_prompt_tokens=80" in said[0]
