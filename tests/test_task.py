"""The embedded arithmetic task: traces, the answer parser, splits, determinism."""
import pytest

from grpo_ablate.tasks.arithmetic import ArithmeticTask, parse_answer, worked_trace


@pytest.mark.parametrize("a, b, trace", [
    (471, 59, "1+9=10,7+5+1=13,4+1=5"),   # the format in DESIGN.md
    (3, 4, "3+4=7"),
    (99, 1, "9+1=10,9+1=10"),             # the final carry shows in the answer only
    (471, 5, "1+5=6,7=7,4=4"),
    (0, 0, "0+0=0"),
])
def test_worked_trace(a, b, trace):
    assert worked_trace(a, b) == trace


@pytest.mark.parametrize("text, expected", [
    ("1+9=10,7+5+1=13,4+1=5;530", 530),
    ("530", 530),
    ("  ;530 ", 530),
    ("3+4=7;7", 7),
    ("1;2;3", 3),
    ("7+9=16;16x", None),       # garbage after the answer: no answer
    ("7+9=16;", None),          # a trace that never commits
    ("", None),
    ("+=,", None),
])
def test_parse_answer(text, expected):
    assert parse_answer(text) == expected


def test_reward_is_binary_and_checks_the_answer():
    task = ArithmeticTask("easy")
    p = task.make(47, 59)
    assert p.solution == "7+9=16,4+5+1=10;106"
    assert task.reward(p.solution, p) == 1.0
    assert task.reward("7+9=16,4+5+1=10;107", p) == 0.0
    assert task.reward("106", p) == 1.0         # a bare answer still counts


@pytest.mark.parametrize("level, lo, hi", [("easy", 0, 99), ("medium", 0, 999), ("hard", 10, 9999)])
def test_levels_bound_the_operands(level, lo, hi):
    task = ArithmeticTask(level)
    for p in task.train_batch(200, 0, 1):
        a, b = map(int, p.prompt[:-1].split("+"))
        assert lo <= a <= hi and lo <= b <= hi


def test_eval_split_is_held_out_and_fixed():
    task = ArithmeticTask("easy", eval_size=100)
    eval_prompts = {p.prompt for p in task.eval_set()}
    assert len(task.eval_set()) == 100
    assert [p.prompt for p in ArithmeticTask("easy", eval_size=100).eval_set()] == \
        [p.prompt for p in task.eval_set()]
    train = {p.prompt for s in range(50) for p in task.train_batch(64, 0, s)}
    assert not (train & eval_prompts)


def test_train_batches_are_a_function_of_seed_and_step():
    task = ArithmeticTask("medium")
    assert task.train_batch(8, 0, 5) == task.train_batch(8, 0, 5)
    assert task.train_batch(8, 0, 5) != task.train_batch(8, 1, 5)
    assert task.train_batch(8, 0, 5) != task.train_batch(8, 0, 6)


def test_completion_lengths_vary():
    lengths = {len(p.solution) for p in ArithmeticTask("medium").train_batch(300, 0, 0)}
    assert min(lengths) <= 7 and max(lengths) >= 25


def test_bare_answer_format_and_explicit_operand_range():
    task = ArithmeticTask(trace=False, operand_min=10, operand_max=99)
    p = task.train_batch(1, 0, 0)[0]
    a, b = map(int, p.prompt[:-1].split("+"))
    assert 10 <= a <= 99 and 10 <= b <= 99 and p.solution == str(a + b)


def test_unknown_level_names_the_allowed_ones():
    with pytest.raises(ValueError, match="easy, medium, hard"):
        ArithmeticTask("insane")
