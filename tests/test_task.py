"""The embedded arithmetic task: traces, the answer parser, the held-out eval partition, determinism."""
import itertools
import random

import pytest

from grpo_ablate.config.compose import compose
from grpo_ablate.model_source import warm_start_dir
from grpo_ablate.tasks import build_task
from grpo_ablate.tasks.arithmetic import ArithmeticTask, parse_answer, worked_trace
from grpo_ablate.tasks.holdout import PARTITION, held_out


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


def test_the_eval_set_is_distinct_fixed_and_inside_the_partition():
    task = ArithmeticTask("easy", eval_size=100)
    prompts = [p.prompt for p in task.eval_set()]
    assert len(prompts) == len(set(prompts)) == 100                 # distinct: a greedy eval scores each once
    assert prompts == [p.prompt for p in ArithmeticTask("easy", eval_size=100).eval_set()]
    assert all(held_out(p) for p in prompts)
    assert {len(p) for p in prompts} >= {4, 5, 6}                  # short and long sums, as training draws them


def test_the_eval_set_is_drawn_once_per_process_and_each_task_gets_its_own():
    """A sweep's plan builds a task per variant: the second build reuses the first's draw, equal to
    drawing afresh, and a task that changes its eval set changes no other task's."""
    first = ArithmeticTask("medium", eval_size=30, operand_max=500)
    assert first._eval_pairs(30) == first._draw_eval_pairs(30)
    first._eval_pairs(30).clear()
    first.eval_set().clear()
    again = ArithmeticTask("medium", eval_size=30, operand_max=500)
    assert [p.prompt for p in again.eval_set()] == [f"{a}+{b}=" for a, b in first._draw_eval_pairs(30)]


def test_eval_size_changes_no_training_draw_and_no_warm_start():
    """task.eval_size=1000 changes the eval only. Every training draw, the prompt pool,
    the warm start's draws and its cache key are those of eval_size=200, whose eval set is the
    first 200 problems of eval_size=1000's."""
    small, large = ArithmeticTask(eval_size=200), ArithmeticTask(eval_size=1000)
    for seed, step, round_ in itertools.product((0, 1, 7), (1, 2, 30), (0, 1, 3)):
        assert small.train_batch(16, seed, step, round_) == large.train_batch(16, seed, step, round_)
    assert small.prompt_pool(256, seed=3) == large.prompt_pool(256, seed=3)
    rng_small, rng_large = random.Random("warmup/0"), random.Random("warmup/0")   # as models.warm_start
    for _ in range(5):
        assert small.warmup_batch(32, rng_small) == large.warmup_batch(32, rng_large)
    assert large.eval_set()[:200] == small.eval_set()
    model = compose([]).model
    assert warm_start_dir(model, small) == warm_start_dir(model, large)
    assert "eval_size" not in small.describe() and small.describe()["holdout"] == PARTITION


@pytest.mark.full
def test_eval_size_is_not_in_the_warm_start_a_composed_config_asks_for():
    """The same through Hydra, as `grpo-ablate train` composes it (no training)."""
    dirs = {warm_start_dir(cfg.model, build_task(cfg.task))
            for cfg in (compose([]), compose(["task.eval_size=1000"]), compose(["task.eval_size=2000"]))}
    assert len(dirs) == 1
    assert warm_start_dir(compose(["task.level=medium"]).model, build_task(compose(["task.level=medium"]).task)) \
        not in dirs                                                # what defines training still counts


@pytest.mark.parametrize("options", [{"level": "easy"}, {"level": "medium"}, {"operand_max": 9, "eval_size": 16}])
def test_no_eval_problem_is_ever_drawn_for_training(options):
    task = ArithmeticTask(**options)
    trained = {p.prompt for step in range(1, 101) for p in task.train_batch(32, seed=0, step=step)}
    trained |= {p.prompt for p in task.train_batch(500, seed=1, step=1, round=2) + task.prompt_pool(1000, seed=0)}
    trained |= {p.prompt for p in task.warmup_batch(1000, random.Random("warmup/0"))}
    assert not trained & {p.prompt for p in task.eval_set()}
    assert not any(held_out(p) for p in trained)                   # the partition, not just the drawn eval set


@pytest.mark.full
@pytest.mark.parametrize("options, held", [({}, 2513), ({"operand_min": 10, "operand_max": 99}, 2060),
                                           ({"operand_max": 9}, 18)])
def test_an_eval_larger_than_the_partition_is_one_line(options, held):
    """The partition's size (measured: easy 2513 of 10,000 ordered pairs, W1's 10..99 2060 of 8100,
    the test config's 0..9 18 of 100): eval_size up to it works, one more is refused."""
    assert len(ArithmeticTask(eval_size=held, **options).eval_set()) == held
    with pytest.raises(ValueError, match=f"task.eval_size={held + 1} is more than the {held} held-out problems") as err:
        ArithmeticTask(eval_size=held + 1, **options)
    assert "\n" not in str(err.value)


def test_a_space_held_out_whole_is_refused():
    """Operands 15..15 have one problem, 15+15=, and it is held out: nothing would be left to train on."""
    assert held_out("15+15=")
    with pytest.raises(ValueError, match="every problem of operands 15..15 is held out"):
        ArithmeticTask(operand_min=15, operand_max=15, eval_size=1)


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


@pytest.mark.parametrize("name, overrides", [("arithmetic", []), ("quiz", []),
                                             ("jsonl", ["task.path=tests/data/word_problems.jsonl",
                                                        "task.eval_size=5"])])
@pytest.mark.parametrize("completion", ["", "no answer here", "\\boxed{", "#### ", "\x00\ufffd", "1" * 5000])
def test_every_sample_gets_exactly_one_reward_even_when_its_answer_does_not_parse(name, overrides, completion):
    """NeMo-RL c112cfe15: a failed parse must still score (0), so that a group keeps its size. Here every
    task's reward is a float for any text: an unparsed answer is wrong, never an exception or a gap (a run of
    5000 digits used to raise in int() for arithmetic and quiz)."""
    from grpo_ablate.config.compose import compose
    from grpo_ablate.tasks import build_task

    task = build_task(compose([f"task={name}", *overrides]).task)
    problem = task.eval_set()[0]
    assert task.reward(completion, problem) == 0.0
