"""Token baselines (otb and rae), length penalty, replace and pool sampling, optimizer-state reset,
staleness and vcpo's lr scale against their references, in float64.
Each expected number is worked by hand (plain floats) from the cited source:
- verl verl/trainer/ppo/core_algos.py `compute_optimal_token_baseline_advantage` and
  `compute_multi_turn_optimal_token_baseline_advantage`, verl/utils/torch_functional.py
  `calculate_sum_pi_squared_from_logits` (commit b178a3cd56f58b2d502255daba591e92833930a7).
- PipelineRL pipelinerl/actor.py (difficulty-aware length penalty) and pipelinerl/domains/math/
  rollouts.py `length_penalty` (commit 58d393458625ad63ed539f2dcd072c85700c557f).
- SkyRL skyrl/train/utils/trainer_utils.py `handle_replace_sampling`, `get_bad_sample_replacements`
  (commit a9564572eb8e91076be43c1bd5e4615e3de17265).
- slime slime/backends/megatron_utils/stateless_adam.py `StatelessAdam.step` and model.py's
  --reset-optimizer-states block (commit 624b824a898ab0ec1fcb4d373004c7f3852bf515); Adam as
  torch.optim.AdamW documents it.
- verl's v1 replay buffer (trainer.v1.sampler.max_off_policy_threshold / max_off_policy_strategy:
  `_drop_max_off_policy_samples` drops global_steps - step + 1 > T, `_has_enough_samples` waits
  while an in-flight group has reached T), as read in the index (verl main, 2026).
- prime-rl src/prime_rl/orchestrator/curriculum/samplers/pool.py `DifficultyPoolSampler` and
  DifficultyPoolSamplerConfig's default pools, src/prime_rl/orchestrator/algo/rae.py `RAEAlgorithm`
  (commit 559b44772e471d1538537b8805cc77f3824a5e64).
- VCPO (mit-han-lab/vcpo, commit c7f030f0b77237cfb0e75e720669e2917a1bb56e): recipe/fully_async_policy/
  staleness_utils.py `compute_ess_info`, verl/workers/actor/megatron_actor.py's ess_scaling block.
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


# ------------------------------------------------------------------ optimal token baseline
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


@pytest.mark.parametrize("overrides, message", [
    (["adv=optimal_token_baseline", "adv.positions=turns"], "adv.positions='turns' is not allowed"),
    (["adv=optimal_token_baseline", "adv.eps=0"], "adv.eps=0 is not allowed"),
    (["adv=optimal_token_baseline", "adv.zero_tail=1"], "adv.zero_tail=1 is not allowed"),
    (["adv=optimal_token_baseline", "diag.grad_conflict=true"], "per-component advantages have not"),
    (["adv=rae", "diag.grad_conflict=true"], "adv=rae reads its EMA baseline"),
    (["overlong=soft_punish", "overlong.gamma=1", "adv=gae", "rollout.group_size=1"], "a group of one has not"),
    (["staleness=spread", "staleness.strategy=wait"], "staleness.strategy=wait caps the ages"),
    (["prompt_pool=difficulty", "prompt_pool.draw=weights", "prompt_pool.easy_weight=0",
      "prompt_pool.normal_weight=0", "prompt_pool.hard_weight=0"], "needs a pool with a positive weight"),
])
def test_bad_baseline_sampling_and_staleness_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(overrides))


# ------------------------------------------------------------------ difficulty-aware overlong penalty
def test_difficulty_aware_penalty_is_pipelinerls():
    # max_tokens 8, buffer 4: length_penalty = (4 - |o|) / 4 past 4 tokens. Group 0 solves 2 of 4 (rate .5),
    # group 1 both (rate 1), one of them truncated (the hard cap guard keeps its full penalty)
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0], dtype=D)
    lengths = torch.tensor([7, 6, 7, 3, 8, 5])
    truncated = torch.tensor([False, False, False, False, True, False])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    correct = rewards > 0
    punish = option("overlong", "soft_punish")
    _, _, dapo = punish.bind({"buffer": 4})(rewards, lengths, truncated, groups, correct, 8)
    torch.testing.assert_close(dapo, torch.tensor([-0.75, -0.5, -0.75, 0.0, -1.0, -0.25], dtype=D))
    shaped, keep, penalty = punish.bind({"buffer": 4, "gamma": 2.0, "failure_scale": 0.5})(
        rewards, lengths, truncated, groups, correct, 8)
    # successes x .5^2 in group 0, x 1^2 in group 1 (x 1 when truncated); the failure x .5
    expected = [-0.75 * 0.25, -0.5 * 0.25, -0.75 * 0.5, 0.0, -1.0, -0.25]
    torch.testing.assert_close(penalty, torch.tensor(expected, dtype=D))
    torch.testing.assert_close(shaped, rewards + penalty)
    assert keep.all()


# ------------------------------------------------------------------ SkyRL replace sampling
def replace_batch(scores):
    from grpo_ablate.train.batch import SampledGroups
    n, width = len(scores), 3
    roll = Rollout(torch.arange(n * (2 + width)).view(n, 2 + width), torch.ones(n, 2 + width, dtype=torch.long),
                   2, torch.ones(n, width), torch.zeros(n, dtype=torch.bool))
    return SampledGroups(roll, [f"p{g}" for g in range(n // 2)], [f"t{i}" for i in range(n)],
                         torch.tensor(scores, dtype=torch.float32), torch.arange(n // 2).repeat_interleave(2), 1)


def test_replace_sampling_is_skyrls():
    from grpo_ablate.train.state.sampling import ReplaceFlatGroups
    scores = [1, 0, 1, 1, 0, 0, 1, 0]               # groups 0 and 3 vary, 1 and 2 are flat (G = 2)
    keep = option("sampling", "replace").impl
    grouped = torch.tensor(scores, dtype=D).view(4, 2)
    # SkyRL: usable when the varied groups are MORE than min_replace_ratio of the batch (2 > 1.2; not 2 > 2)
    assert keep(grouped).tolist() == [True] * 4
    assert keep(grouped, min_replace_ratio=0.5).tolist() == [False] * 4
    assert ReplaceFlatGroups(0.5, seed=0).after_sampling(replace_batch(scores), 1, 0).replaced == 0
    out = ReplaceFlatGroups(0.3, seed=0).after_sampling(replace_batch(scores), step=1, pad_id=0)
    assert out.replaced == 2 and out.problems == ["p0", "p3"]
    # each flat group's rows overwritten row for row by a different varied group's (2 varied >= 2 flat:
    # drawn without replacement), and the copy joins its source's group (SkyRL's shared uid)
    copied = [out.texts[2:4], out.texts[4:6]]
    assert sorted(copied) == [["t0", "t1"], ["t6", "t7"]] and out.texts[:2] == ["t0", "t1"]
    assert out.scores.tolist() == [1, 0, *out.scores[2:6].tolist(), 1, 0] and out.scores[2:6].sum() == 2
    for rows, text in ((slice(2, 4), out.texts[2]), (slice(4, 6), out.texts[4])):
        assert out.group_index[rows].tolist() == ([0, 0] if text == "t0" else [1, 1])
    assert torch.bincount(out.group_index).tolist() == [4, 4]
    assert torch.equal(out.roll.sequences[2:4], out.roll.sequences[0:2] if out.texts[2] == "t0"
                       else out.roll.sequences[6:8])


def test_replace_sampling_draws_with_replacement_when_varied_groups_are_fewer():
    from grpo_ablate.train.state.sampling import ReplaceFlatGroups
    scores = [1, 0, 1, 1, 0, 0, 1, 1]               # one varied group, three flat: ratio 0.2 lets it through
    out = ReplaceFlatGroups(0.2, seed=0).after_sampling(replace_batch(scores), step=1, pad_id=0)
    assert out.replaced == 3 and out.problems == ["p0"] and out.texts == ["t0", "t1"] * 4
    assert out.group_index.tolist() == [0] * 8


# ------------------------------------------------------------------ stateless Adam, reset optimizer states
LR, BETAS, EPS, WD = 0.1, (0.9, 0.999), 1e-8, 0.01
GRADS = [[0.5, -0.25], [-1.0, 0.1], [0.3, 0.3]]


def adam_by_hand(steps_between_resets):
    """AdamW (decoupled decay, bias correction) on p0 = (1, -2) with GRADS, its moments restarting
    after every `steps_between_resets` steps (None: never)."""
    p, m, v, t = [1.0, -2.0], [0.0, 0.0], [0.0, 0.0], 0
    for k, g in enumerate(GRADS):
        if steps_between_resets and k % steps_between_resets == 0:
            m, v, t = [0.0, 0.0], [0.0, 0.0], 0
        t += 1
        for i in range(2):
            p[i] *= 1 - LR * WD
            m[i] = BETAS[0] * m[i] + (1 - BETAS[0]) * g[i]
            v[i] = BETAS[1] * v[i] + (1 - BETAS[1]) * g[i] ** 2
            p[i] -= LR * (m[i] / (1 - BETAS[0] ** t)) / (math.sqrt(v[i] / (1 - BETAS[1] ** t)) + EPS)
    return p


def slime_stateless_by_hand():
    """slime StatelessAdam.step (bias_correction, adam_w_mode): p <- p (1 - lr wd); p -= lr g / (|g| + eps)."""
    p = [1.0, -2.0]
    for g in GRADS:
        p = [p[i] * (1 - LR * WD) - LR * g[i] / (abs(g[i]) + EPS) for i in range(2)]
    return p


def adamw_run(every, steps_per_rollout=2):
    from grpo_ablate.train.state.optim_state import OptimizerReset
    param = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=D))
    optimizer = torch.optim.AdamW([param], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    plugin = None if every is None else OptimizerReset(option("optim_state", "reset").bind({"every": every}), every)
    for k, g in enumerate(GRADS):
        param.grad = torch.tensor(g, dtype=D)
        optimizer.step()
        if plugin is not None:
            plugin.after_optimizer_step(optimizer)
            if (k + 1) % steps_per_rollout == 0:
                plugin.after_update(optimizer)
    return param.detach().tolist(), plugin


def test_stateless_adam_is_slimes_update_and_reset_after_each_rollout_restarts_adam():
    got, plugin = adamw_run("step")
    assert got == pytest.approx(slime_stateless_by_hand(), abs=1e-12)
    assert got == pytest.approx(adam_by_hand(1), abs=1e-12) and plugin.resets == 3
    got, plugin = adamw_run("rollout")            # rollouts of 2 optimizer steps: moments kept within one
    assert got == pytest.approx(adam_by_hand(2), abs=1e-12) and plugin.resets == 1
    assert adamw_run(None)[0] == pytest.approx(adam_by_hand(None), abs=1e-12)
    assert adam_by_hand(2) != pytest.approx(adam_by_hand(None), abs=1e-3)   # the reset changes the third step


# ------------------------------------------------------------------ verl staleness control drop | wait
def test_staleness_control_is_verls_threshold():
    from grpo_ablate.tricks.staleness import capped_ages
    ages = torch.tensor([0, 1, 2, 3, 4])
    # T = 3 (max_age 2): a group spans age + 1 versions, 1..5; drop those over 3, or wait so none exceeds it
    kept_ages, keep = capped_ages(ages, 2, "drop")
    assert kept_ages.tolist() == [0, 1, 2, 3, 4] and keep.tolist() == [True, True, True, False, False]
    kept_ages, keep = capped_ages(ages, 2, "wait")
    assert kept_ages.tolist() == [0, 1, 2, 2, 2] and keep.all()
    spread = option("staleness", "spread").impl
    drop = spread(64, 4, torch.Generator().manual_seed(0), k=4, max_age=1)
    wait = spread(64, 4, torch.Generator().manual_seed(0), k=4, max_age=1, strategy="wait")
    assert torch.equal(wait[0], drop[0].clamp(max=1)) and wait[1].all() and torch.equal(drop[1], drop[0] <= 1)
    assert not drop[1].all()


# ------------------------------------------------------------------ prime-rl DifficultyPoolSampler weights
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


# ------------------------------------------------------------------ prime-rl RAE
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


# ------------------------------------------------------------------ VCPO's ESS learning-rate scaling
def test_vcpo_ess_scale_is_vcpos():
    ess = option("lr_scale", "ess").impl
    # sequence IS weights 1, 2, .5, 4 (log-ratios summed over each row's trained tokens; row 5 has none)
    logs = [0.0, math.log(2), math.log(0.5), math.log(4), 7.0]
    old = torch.tensor([[v / 2, v / 2] for v in logs], dtype=D)
    mask = torch.tensor([[1, 1]] * 4 + [[0, 0]], dtype=D)
    sampler = torch.zeros_like(old)
    ratio = 7.5 ** 2 / (21.25 + 1e-8) / 4          # ESS = (sum w)^2 / (sum w^2 + eps) = 2.647; / n = .662
    scale, metrics = ess(old, sampler, mask)
    assert scale == pytest.approx(math.sqrt(ratio), abs=1e-12) and metrics["optim/ess_ratio"] == pytest.approx(ratio)
    assert ess(old, sampler, mask, rule="linear")[0] == pytest.approx(ratio, abs=1e-12)
    assert ess(old, sampler, mask, base_ess_ratio=0.5)[0] == 1.0              # min(1, .662 / .5)
    assert ess(old, old, mask)[0] == pytest.approx(1.0) and ess(old, None, mask)[0] == 1.0   # on-policy


def test_scaled_lr_scales_one_step_and_restores():
    from grpo_ablate.train.step import scaled_lr
    param = torch.nn.Parameter(torch.tensor([1.0], dtype=D))
    optimizer = torch.optim.SGD([param], lr=0.5)
    param.grad = torch.tensor([1.0], dtype=D)
    with scaled_lr(optimizer, 0.25):
        optimizer.step()
    assert param.item() == pytest.approx(1.0 - 0.125) and optimizer.param_groups[0]["lr"] == 0.5


def test_vcpo_ess_lr_acts_on_stale_rollouts(small, tmp_path):
    overrides = small + ["steps=3", "+trick=vcpo_ess_lr", "staleness=fixed"]
    train(compose(overrides), tmp_path / "run", overrides)
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")[1:]
    assert rows[0]["optim/lr_scale"] == pytest.approx(1.0)       # step 1 samples with the start: on-policy
    assert all(0 < r["optim/lr_scale"] <= 1 and 0 < r["optim/ess_ratio"] <= 1 + 1e-9 for r in rows)


# every new knob's bad value, as a user meets it: one `error:` line, exit 2, nothing written
CLI_REFUSALS = [
    ("adv=optimal_token_baseline adv.positions=turns", "adv.positions"),
    ("overlong=soft_punish overlong.gamma=-1", "overlong.gamma"),
    ("overlong=soft_punish overlong.failure_scale=1.5", "overlong.failure_scale"),
    ("sampling=replace sampling.min_replace_ratio=2", "sampling.min_replace_ratio"),
    ("optim_state=reset optim_state.every=epoch", "optim_state.every"),
    ("staleness=spread staleness.strategy=block", "staleness.strategy"),
    ("prompt_pool=difficulty prompt_pool.draw=pools", "prompt_pool.draw"),
    ("prompt_pool=difficulty prompt_pool.hard_weight=-1", "prompt_pool.hard_weight"),
    ("adv=rae adv.decay=1", "adv.decay"),
    ("lr_scale=ess lr_scale.rule=log", "lr_scale.rule"),
    ("lr_scale=ess lr_scale.base_ess_ratio=0", "lr_scale.base_ess_ratio"),
    ("rollout_correction=rejection rollout_correction.criteria=[token_k9] rollout_correction.thresholds=[1]",
     "rollout_correction.criteria"),
    ("rollout_correction=rejection rollout_correction.criteria=[token_k1] rollout_correction.thresholds=[1]",
     "rollout_correction.thresholds"),
]


@pytest.mark.parametrize("overrides, needle", CLI_REFUSALS)
def test_a_bad_value_of_every_new_knob_is_one_line_exit_2_and_no_run_dir(tmp_path, overrides, needle):
    refused_train(overrides, needle, tmp_path)


def test_named_tricks_of_the_rest_compose():
    cfg = compose(["+trick=difficulty_aware_penalty"])
    validate(cfg)
    assert (cfg.overlong.name, cfg.overlong.gamma, cfg.overlong.failure_scale) == ("soft_punish", 1.0, 1.0)
    cfg = compose(["+trick=difficulty_pool_sampler"])
    validate(cfg)
    assert (cfg.prompt_pool.draw, cfg.prompt_pool.hard_border, cfg.prompt_pool.easy_border) == ("weights", 0.25, 0.75)
    cfg = compose(["+trick=staleness_wait"])
    validate(cfg)
    assert (cfg.staleness.name, cfg.staleness.max_age, cfg.staleness.strategy) == ("spread", 2, "wait")


def test_optimizer_resets_count_in_a_run(small, tmp_path):
    for every, resets in (("step", [2, 4]), ("rollout", [1, 2])):
        overrides = small + ["steps=2", "updates=mini_batches", "updates.mini_batches=2",
                             f"+trick={'stateless_adam' if every == 'step' else 'reset_optimizer_states'}"]
        train(compose(overrides), tmp_path / every, overrides)
        rows = read_rows(tmp_path / every / "metrics.jsonl")[1:]
        assert [r["optim/state_resets"] for r in rows] == resets


def test_staleness_wait_trains_no_group_older_than_max_age(small, tmp_path):
    overrides = small + ["steps=3", "+trick=staleness_wait", "staleness.max_age=0"]
    train(compose(overrides), tmp_path / "run", overrides)
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")[1:]
    assert all(r["staleness/max_age"] == 0 and r["staleness/dropped_frac"] == 0 for r in rows)


def test_named_otb_tricks_compose():
    cfg = compose(["+trick=tir_optimal_token_baseline"])
    validate(cfg)
    assert (cfg.adv.name, cfg.adv.positions, cfg.adv.zero_tail) == ("optimal_token_baseline", "trained", True)
    assert compose(["+trick=optimal_token_baseline"]).adv.positions == "absolute"


def test_otb_difficulty_penalty_replace_sampling_and_pool_weights_train(small, tmp_path):
    overrides = small + ["steps=2", "+trick=[tir_optimal_token_baseline,difficulty_aware_penalty,"
                                    "dynamic_sampling_replace,difficulty_pool_sampler]"]
    train(compose(overrides), tmp_path / "run", overrides)
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")[1:]
    assert all(r["adv/token_energy"] > 0 and r["adv/std"] > 0 and r["loss"] is not None for r in rows)
    assert all("sampling/replaced_groups" in r and "pool/sorted" in r for r in rows)
