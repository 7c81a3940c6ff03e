"""The prompt pool (data): ScaleRL's no-positive-resampling and prime-rl's difficulty
pools. The rules are checked on worked vectors in float64 (ScaleRL Sec. 3: pass rate >= 0.9 leaves
the pool for later epochs; prime-rl orchestrator/buffer.py, DifficultyPoolBufferConfig: easy when
p > 0.8, hard when p < 0.2, fractions 0.1 / 0.1, a short pool's deficit to normal); the trainer
tests run the small model and resume a killed run exactly."""
import math

import pytest
import torch

from conftest import refused_train
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.config.inert import inert_reason
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows
from grpo_ablate.config.spec import run_spec
from grpo_ablate.train.grpo import train
from grpo_ablate.errors import ConfigError
from grpo_ablate.train.state.prompt_pool import prompt_pool
from grpo_ablate.tricks import option

D = torch.float64
NAN = math.nan


def impl(name):
    return option("prompt_pool", name).impl


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- the rules
def test_no_positive_resampling_retires_pass_rates_at_the_bound():
    # G = 8: 7/8 = 0.875 stays, 0.9 (a G = 10 group's 9/10) and 8/8 leave; unseen (NaN) stays
    pass_rate = torch.tensor([0.875, 0.9, 1.0, NAN, 0.0, 0.5], dtype=D)
    order, retired = impl("no_positive_resampling")(pass_rate, torch.zeros(6, dtype=torch.bool), 6, gen(),
                                                    max_pass=0.9)
    assert retired.tolist() == [False, True, True, False, False, False]
    assert sorted(order.tolist()) == [0, 3, 4, 5]                        # one epoch over the rest
    # retired stays retired, whatever its pass rate is now
    pass_rate[1] = 0.0
    _, again = impl("no_positive_resampling")(pass_rate, retired, 6, gen(), max_pass=0.9)
    assert again[1]
    # every prompt retired: the epoch runs over the whole pool again
    order, retired = impl("no_positive_resampling")(torch.ones(4, dtype=D), torch.zeros(4, dtype=torch.bool), 4,
                                                    gen(), max_pass=0.9)
    assert retired.all() and sorted(order.tolist()) == [0, 1, 2, 3]


def test_epochs_are_seeded_permutations_of_the_whole_pool():
    pass_rate = torch.tensor([1.0, 1.0, 0.0, NAN], dtype=D)
    order, retired = impl("epochs")(pass_rate, torch.zeros(4, dtype=torch.bool), 4, gen(3))
    assert sorted(order.tolist()) == [0, 1, 2, 3] and not retired.any()
    assert torch.equal(order, impl("epochs")(pass_rate, retired, 4, gen(3))[0])


def test_difficulty_pools_draw_prime_rls_fractions():
    # 4 easy (> 0.8), 3 hard (< 0.2), the rest normal (0.8 and 0.2 themselves, unseen)
    pass_rate = torch.tensor([1.0, 0.9, 0.85, 1.0, 0.0, 0.1, 0.125, 0.8, 0.2, 0.5, NAN, NAN, 0.6, 0.3], dtype=D)
    easy, hard = {0, 1, 2, 3}, {4, 5, 6}
    no = torch.zeros(14, dtype=torch.bool)
    got, _ = impl("difficulty")(pass_rate, no, 10, gen(), easy_border=0.8, hard_border=0.2, easy_fraction=0.1,
                                hard_fraction=0.1)
    got = got.tolist()
    assert len(got) == len(set(got)) == 10
    # floor(10 x 0.1) = 1 easy, 1 hard, 8 normal: normal holds 7, so its deficit of 1 comes from the rest
    assert len(easy & set(got)) + len(hard & set(got)) == 3 and {7, 8, 9, 10, 11, 12, 13} <= set(got)
    got, _ = impl("difficulty")(pass_rate, no, 5, gen(), easy_border=0.8, hard_border=0.2, easy_fraction=0.2,
                                hard_fraction=0.4)
    assert len(easy & set(got.tolist())) == 1 and len(hard & set(got.tolist())) == 2
    # no easy prompt: its share goes to normal
    flat = torch.tensor([0.5] * 6 + [0.0] * 2, dtype=D)
    got, _ = impl("difficulty")(flat, no[:8], 4, gen(), easy_fraction=0.5, hard_fraction=0.25)
    got = got.tolist()
    assert sum(i >= 6 for i in got) == 1 and len(set(got)) == 4
    # more than the pool: every prompt, then repeats
    got, _ = impl("difficulty")(flat, no[:8], 11, gen())
    assert len(got) == 11 and set(got.tolist()) == set(range(8))


# ---------------------------------------------------------------- the pool the trainer keeps
class Problems:
    def prompt_pool(self, size, seed):
        return [f"p{i}" for i in range(size)]


def pool_of(overrides):
    return prompt_pool(run_spec(compose(overrides)), Problems(), policies=None)


def test_retired_prompts_leave_at_the_next_epoch_and_the_state_resumes_exactly():
    pool = pool_of(["prompt_pool=no_positive_resampling", "prompt_pool.size=6"])
    first, idx = pool.draw(4, step=1, sampling_round=0)
    pool.observe(idx, torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]))
    solved = {idx[0].item(), idx[2].item()}
    second, idx2 = pool.draw(4, step=2, sampling_round=0)                   # 2 left of epoch 1, 2 of epoch 2
    assert pool.epoch == 2 and pool.metrics(None)["pool/retired"] == 2
    assert not solved & set(idx2[2:].tolist())                             # retired from epoch 2 on
    state = pool.state_dict()
    resumed = pool_of(["prompt_pool=no_positive_resampling", "prompt_pool.size=6"])
    resumed.load_state_dict(state)
    assert [resumed.draw(3, s, 0)[1].tolist() for s in (3, 4)] == [pool.draw(3, s, 0)[1].tolist() for s in (3, 4)]


def test_difficulty_pool_metrics_count_the_pools():
    pool = pool_of(["prompt_pool=difficulty", "prompt_pool.size=5"])
    _, idx = pool.draw(5, step=1, sampling_round=0)
    pool.observe(idx, torch.tensor([[1.0, 1.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 1.0]]))
    assert pool.metrics(None) == {"pool/retired": 0, "pool/unseen": 0, "pool/epoch": 0, "pool/all_retired": 0,
                              "pool/easy": 2, "pool/hard": 2, "pool/sorted": 4}


def test_a_pool_whose_every_prompt_retired_says_so_as_it_draws_them_all_again():
    pool = pool_of(["prompt_pool=no_positive_resampling", "prompt_pool.size=4"])
    _, idx = pool.draw(4, step=1, sampling_round=0)
    pool.observe(idx, torch.ones(4, 2))                                    # every prompt solved
    _, again = pool.draw(4, step=2, sampling_round=0)
    assert sorted(again.tolist()) == [0, 1, 2, 3] and pool.metrics(None)["pool/all_retired"] == 1


# ---------------------------------------------------------------- inert rules and bad values
def test_inert_when_the_run_never_starts_a_second_epoch_or_no_pool_is_reachable():
    cfg = compose(["prompt_pool=no_positive_resampling", "prompt_pool.size=240"])     # 30 steps x 8 prompts
    assert "never starts a second epoch" in inert_reason(cfg, "prompt_pool", "no_positive_resampling")
    assert inert_reason(compose(["prompt_pool=no_positive_resampling"]), "prompt_pool",
                        "no_positive_resampling") is None
    cfg = compose(["prompt_pool=difficulty", "prompt_pool.easy_border=1", "prompt_pool.hard_border=0"])
    assert "every prompt stays normal" in inert_reason(cfg, "prompt_pool", "difficulty")


@pytest.mark.parametrize("override, needle", [
    ("prompt_pool=shuffled", "prompt_pool=shuffled"),
    ("prompt_pool=no_positive_resampling prompt_pool.max_pass=1.5", "prompt_pool.max_pass"),
    ("prompt_pool=difficulty prompt_pool.hard_border=0.9", "prompt_pool.hard_border"),
    ("prompt_pool=epochs prompt_pool.size=null", "prompt_pool.size=null"),
])
def test_bad_pool_settings_are_one_line_exit_2_and_no_run_dir(tmp_path, override, needle):
    refused_train(override, needle, tmp_path)


def test_bad_fractions_are_refused():
    from grpo_ablate.errors import ConfigError
    with pytest.raises(ConfigError, match="easy_fraction \\+ hard_fraction = 1.2"):
        validate(compose(["prompt_pool=difficulty", "prompt_pool.easy_fraction=0.7", "prompt_pool.hard_fraction=0.5"]))


# ---------------------------------------------------------------- through the trainer
def rows_of(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)}
            for r in read_rows(run_dir / "metrics.jsonl")][1:]


def run(overrides, run_dir):
    return train(compose(overrides), run_dir, overrides)


@pytest.mark.parametrize("pool, activity", [
    # the small model solves a one-digit sum ~30% of the time: a bound of 0.5 retires some within 4 steps
    (["+trick=no_positive_resampling", "prompt_pool.size=6", "prompt_pool.max_pass=0.5"], "pool/retired"),
    (["+trick=difficulty_curriculum", "prompt_pool.size=12"], "pool/sorted"),
])
def test_pool_trains_acts_and_resumes_exactly(small, tmp_path, pool, activity):
    args = small + pool
    rows = rows_of(run(args, tmp_path / "full").run_dir)
    assert [r["pool/unseen"] for r in rows][0] < int(pool[1].split("=")[1])
    assert any(r[activity] > 0 for r in rows), [r[activity] for r in rows]
    retired = [r["pool/retired"] for r in rows]
    assert retired == sorted(retired)                                      # for the rest of the run
    run([*args, "steps=2"], tmp_path / "part")                             # the pool is checkpointed
    run(args + ["resume=true"], tmp_path / "part")
    assert rows_of(tmp_path / "part") == rows


def test_default_pool_is_the_tasks_own_order(small, tmp_path):
    rows = rows_of(run(small + ["steps=1"], tmp_path / "run").run_dir)
    assert not any(k.startswith("pool/") for k in rows[0])


# prime-rl src/prime_rl/orchestrator/curriculum/samplers/pool.py `DifficultyPoolSampler` and
# DifficultyPoolSamplerConfig's default pools (commit 559b44772e471d1538537b8805cc77f3824a5e64)
def test_difficulty_pool_sampler_weights_are_prime_rls():
    from grpo_ablate.tricks.prompt_pool import pool_weights
    # prime-rl's pools: hard <= .25 (weight .2), normal <= .75 (1), easy the rest (.2); unseen 1
    rates = torch.tensor([float("nan"), 0.0, 0.25, 0.5, 0.75, 0.875, 1.0])
    assert pool_weights(rates, (0.75, 0.25), (0.2, 1.0, 0.2)).tolist() == [1.0, 0.2, 0.2, 1.0, 1.0, 0.2, 0.2]
    draw = option("prompt_pool", "difficulty").bind(
        {"draw": "weights", "easy_border": 0.75, "hard_border": 0.25})
    chosen, retired = draw(rates, torch.zeros(7, dtype=torch.bool), 46000, torch.Generator().manual_seed(0))
    share = torch.bincount(chosen, minlength=7).double() / 46000        # with replacement, in proportion
    expected = torch.tensor([1.0, 0.2, 0.2, 1.0, 1.0, 0.2, 0.2], dtype=D) / 3.8
    torch.testing.assert_close(share, expected, atol=0.01, rtol=0)
    assert not retired.any()


def test_the_difficulty_pool_sampler_trick_composes():
    cfg = compose(["+trick=difficulty_pool_sampler"])
    validate(cfg)
    assert (cfg.prompt_pool.draw, cfg.prompt_pool.hard_border, cfg.prompt_pool.easy_border) == ("weights", 0.25, 0.75)


@pytest.mark.parametrize("overrides, message", [
    (["prompt_pool=difficulty", "prompt_pool.draw=weights", "prompt_pool.easy_weight=0",
      "prompt_pool.normal_weight=0", "prompt_pool.hard_weight=0"], "needs a pool with a positive weight"),
])
def test_bad_difficulty_pool_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(overrides))


# a bad value of each knob, as a user meets it: one `error:` line, exit 2, nothing written
@pytest.mark.parametrize("overrides, needle", [
    ("prompt_pool=difficulty prompt_pool.draw=pools", "prompt_pool.draw"),
    ("prompt_pool=difficulty prompt_pool.hard_weight=-1", "prompt_pool.hard_weight"),
])
def test_a_bad_difficulty_pool_value_is_one_line_exit_2_and_no_run_dir(tmp_path, overrides, needle):
    refused_train(overrides, needle, tmp_path)
