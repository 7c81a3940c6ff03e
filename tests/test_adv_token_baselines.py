"""Family `adv`, the token baselines against their references, in float64: verl's optimal token
baseline (OTB) and its multi-turn form (TIR), with the per-token energy of the forward it reads, and
prime-rl's RAE (an EMA baseline carried across steps). Expected numbers worked by hand from:
- verl verl/trainer/ppo/core_algos.py `compute_optimal_token_baseline_advantage` and
  `compute_multi_turn_optimal_token_baseline_advantage`, verl/utils/torch_functional.py
  `calculate_sum_pi_squared_from_logits` (commit b178a3cd56f58b2d502255daba591e92833930a7).
- prime-rl src/prime_rl/orchestrator/algo/rae.py `RAEAlgorithm` (commit 559b44772e471d1538537b8805cc77f3824a5e64).
"""
import math
from types import SimpleNamespace

import pytest
import torch

from conftest import refused_train
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.rundir.files import read_rows
from grpo_ablate.sampling.decode import Rollout
from grpo_ablate.train.forward import completion_logprobs
from grpo_ablate.train.grpo import train
from grpo_ablate.tricks import option

D = torch.float64


def otb(rewards, groups, mask, energy, **knobs):
    return option("adv", "optimal_token_baseline").bind(knobs)(
        torch.tensor(rewards, dtype=D), torch.tensor(groups), torch.tensor(mask, dtype=D),
        torch.tensor(energy, dtype=D), {})


# group 0: a (r 1, 3 tokens, w .5 .2 .1 -> W .5 .7 .8), b (r 0, 2 tokens, w .3 .4 -> W .3 .7);
# group 1: c alone (r .5). B_t = sum G W / sum W: B_0 = .5/.8 = .625, B_1 = .7/1.4 = .5, B_2 = .8/.8 = 1
REWARDS, GROUPS = [1.0, 0.0, 0.5], [0, 0, 1]


MASK = [[1, 1, 1], [1, 1, 0], [1, 1, 1]]


ENERGY = [[0.5, 0.2, 0.1], [0.3, 0.4, 9.0], [0.2, 0.2, 0.2]]


def test_otb_is_verls_per_token_baseline():
    got = otb(REWARDS, GROUPS, MASK, ENERGY)
    expected = [[1 - 0.625, 1 - 0.5, 1 - 1.0], [-0.625, -0.5, 0.0], [0.5, 0.5, 0.5]]   # c alone: B = 0
    torch.testing.assert_close(got, torch.tensor(expected, dtype=D), atol=1e-7, rtol=0)


def test_otb_zero_tail_drops_the_baseline_past_the_second_longest_row():
    got = otb(REWARDS, GROUPS, MASK, ENERGY, zero_tail=True)   # a is strictly longest: B_a,2 = 0
    expected = [[0.375, 0.5, 1.0], [-0.625, -0.5, 0.0], [0.5, 0.5, 0.5]]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=D), atol=1e-7, rtol=0)
    tied = otb([1.0, 0.0], [0, 0], [[1, 1], [1, 1]], [[0.5, 0.5], [0.5, 0.5]], zero_tail=True)
    torch.testing.assert_close(tied, torch.tensor([[0.5, 0.5], [-0.5, -0.5]], dtype=D), atol=1e-7, rtol=0)


def test_otb_positions_trained_is_tir_on_a_row_with_a_hole():
    # d: r 1, mask 1 0 1, w .5 (9) .1; e: r 0, mask 1 1 0, w .3 .4
    rewards, groups, mask, energy = [1.0, 0.0], [0, 0], [[1, 0, 1], [1, 1, 0]], [[0.5, 9.0, 0.1], [0.3, 0.4, 0.0]]
    # absolute (OTB): W_d = .5 .5 .6, W_e = .3 .7; B_0 = .5/.8, B_1 = 0 (e alone), B_2 = .6/.6 = 1
    absolute = [[1 - 0.625, 0.0, 0.0], [-0.625, 0.0, 0.0]]
    torch.testing.assert_close(otb(rewards, groups, mask, energy), torch.tensor(absolute, dtype=D), atol=1e-7, rtol=0)
    # trained (tir): d's own tokens W = .5 .6, e's W = .3 .7: B_0 = .5/.8, B_1 = .6/1.3
    trained = [[1 - 0.625, 0.0, 1 - 0.6 / 1.3], [-0.625, -0.6 / 1.3, 0.0]]
    torch.testing.assert_close(otb(rewards, groups, mask, energy, positions="trained"),
                               torch.tensor(trained, dtype=D), atol=1e-7, rtol=0)


def test_otb_positions_agree_on_single_turn_rows_and_tir_drops_empty_rows_from_the_count():
    absolute = otb(REWARDS, GROUPS, MASK, ENERGY, zero_tail=True)
    torch.testing.assert_close(otb(REWARDS, GROUPS, MASK, ENERGY, zero_tail=True, positions="trained"), absolute)
    # a row masked out entirely (overlong filter): tir leaves f alone in its group (B = 0, A = r);
    # OTB counts two rows, and its zero tail then gives f B = 0 as well
    args = ([1.0, 0.0], [0, 0], [[1, 1], [0, 0]], [[0.5, 0.5], [0.5, 0.5]])
    lone = torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=D)
    torch.testing.assert_close(otb(*args, positions="trained"), lone)
    torch.testing.assert_close(otb(*args, zero_tail=True), lone)


def test_energy_of_the_forward_is_one_minus_two_pi_plus_sum_pi_squared():
    logits = torch.tensor([[[2.0, 0.0, -1.0, 0.5], [0.1, 0.2, 0.3, 0.4], [3.0, -2.0, 0.0, 0.0]]], dtype=D)
    ids = torch.tensor([[5, 0, 3, 1]])       # one prompt token, then completion tokens 0, 3, 1

    class Model:   # a forward that returns fixed logits for the positions before each completion token
        def __call__(self, **_):
            return SimpleNamespace(logits=torch.cat([logits, logits[:, -1:]], dim=1))

    roll = Rollout(ids, torch.ones_like(ids), 1, torch.ones(1, 3), torch.zeros(1, dtype=torch.bool))
    T = 0.7
    logp, _, energy = completion_logprobs(Model(), roll, temperature=T, return_energy=True)
    for t, token in enumerate((0, 3, 1)):
        z = [v / T for v in logits[0, t].tolist()]
        norm = sum(math.exp(v) for v in z)
        pi = [math.exp(v) / norm for v in z]
        # verl: sum pi^2 = exp(logsumexp(2 z) - 2 logsumexp(z)); the energy is ||e_o - pi||^2
        sum_sq = math.exp(math.log(sum(math.exp(2 * v) for v in z)) - 2 * math.log(norm))
        assert energy[0, t].item() == pytest.approx(1 - 2 * pi[token] + sum_sq, abs=1e-12)
        assert energy[0, t].item() == pytest.approx(sum(((v == token) - p) ** 2 for v, p in enumerate(pi)), abs=1e-12)
        assert logp[0, t].item() == pytest.approx(math.log(pi[token]), abs=1e-12)


def test_named_otb_tricks_compose():
    cfg = compose(["+trick=tir_optimal_token_baseline"])
    validate(cfg)
    assert (cfg.adv.name, cfg.adv.positions, cfg.adv.zero_tail) == ("optimal_token_baseline", "trained", True)
    assert compose(["+trick=optimal_token_baseline"]).adv.positions == "absolute"


def test_rae_scores_each_row_against_the_ema_before_it_and_carries_it():
    from grpo_ablate.train.state.adv import EmaBaseline
    rae = option("adv", "rae").bind({"decay": 0.5})
    rewards, groups = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=D), torch.tensor([0, 0, 1, 1])
    # b before each row: 0, .5, .25, .625 (b <- .5 b + .5 r after scoring); after the batch: .8125
    torch.testing.assert_close(rae(rewards, groups, None, torch.tensor([0.0], dtype=D), {}),
                               torch.tensor([1.0, -0.5, 0.75, 0.375], dtype=D))
    plugin = EmaBaseline(0.5)
    plugin.after_advantages(rewards)
    assert plugin.estimator_input().tolist() == [0.8125] and plugin.metrics(None) == {"adv/ema_baseline": 0.8125}
    # the next batch starts from it: b .8125 then .40625
    torch.testing.assert_close(rae(torch.tensor([0.0, 1.0], dtype=D), torch.tensor([0, 0]), None,
                                   plugin.estimator_input(), {}), torch.tensor([-0.8125, 1 - 0.40625], dtype=D))
    restored = EmaBaseline(0.5)
    restored.load_state_dict(plugin.state_dict())
    assert restored.baseline == 0.8125


def test_rae_trains_with_groups_of_one(small, tmp_path):
    overrides = small + ["steps=2", "+trick=rae", "rollout.group_size=1", "kl=none"]
    train(compose(overrides), tmp_path / "run", overrides)
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")[1:]
    assert len({r["adv/ema_baseline"] for r in rows}) == 2 and all(r["loss"] is not None for r in rows)


def test_otb_difficulty_penalty_replace_sampling_and_pool_weights_train(small, tmp_path):
    overrides = small + ["steps=2", "+trick=[tir_optimal_token_baseline,difficulty_aware_penalty,"
                                    "dynamic_sampling_replace,difficulty_pool_sampler]"]
    train(compose(overrides), tmp_path / "run", overrides)
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")[1:]
    assert all(r["adv/token_energy"] > 0 and r["adv/std"] > 0 and r["loss"] is not None for r in rows)
    assert all("sampling/replaced_groups" in r and "pool/sorted" in r for r in rows)


@pytest.mark.parametrize("overrides, message", [
    (["adv=optimal_token_baseline", "adv.positions=turns"], "adv.positions='turns' is not allowed"),
    (["adv=optimal_token_baseline", "adv.eps=0"], "adv.eps=0 is not allowed"),
    (["adv=optimal_token_baseline", "adv.zero_tail=1"], "adv.zero_tail=1 is not allowed"),
    (["adv=optimal_token_baseline", "diag.grad_conflict=true"], "per-component advantages have not"),
    (["adv=rae", "diag.grad_conflict=true"], "adv=rae reads its EMA baseline"),
])
def test_bad_adv_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(overrides))


# a bad value of each knob, as a user meets it: one `error:` line, exit 2, nothing written
@pytest.mark.parametrize("overrides, needle", [
    ("adv=optimal_token_baseline adv.positions=turns", "adv.positions"),
    ("adv=rae adv.decay=1", "adv.decay"),
])
def test_a_bad_adv_value_is_one_line_exit_2_and_no_run_dir(tmp_path, overrides, needle):
    refused_train(overrides, needle, tmp_path)
