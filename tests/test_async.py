"""Asynchronous RL reproduced: stale rollouts, the proximal policy, AReaL's decoupled
PPO and M2PO. Expected vectors are worked by hand from the references' source (cited per test),
in float64; the trainer tests run the small model for a few steps."""
import math

import pytest
import torch

from conftest import refused_train
from grpo_ablate.config.compose import compose
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows
from grpo_ablate.train.grpo import train
from grpo_ablate.tricks import option

D = torch.float64


def impl(family, name):
    return option(family, name).impl


# ---------------------------------------------------------------- staleness: which group is how old
def test_fixed_ages_every_group_at_k():
    ages, keep = impl("staleness", "fixed")(5, 9, torch.Generator().manual_seed(0), k=3)
    assert ages.tolist() == [3] * 5 and keep.all()
    ages, keep = impl("staleness", "none")(4, 9, torch.Generator())
    assert ages.tolist() == [0] * 4 and keep.all()
    ages, _ = impl("staleness", "fixed")(2, 1, torch.Generator(), k=3)     # only one older policy yet
    assert ages.tolist() == [1, 1]


def test_mixed_ages_are_seeded_and_take_the_fraction():
    draw = lambda seed, frac: impl("staleness", "mixed")(2000, 9, torch.Generator().manual_seed(seed), k=2,
                                                          stale_frac=frac)[0]
    assert torch.equal(draw(7, 0.3), draw(7, 0.3))                      # deterministic by the seed
    assert set(draw(7, 0.3).tolist()) == {0, 2}
    assert abs((draw(7, 0.3) > 0).double().mean().item() - 0.3) < 0.05
    assert draw(7, 0.0).eq(0).all() and draw(7, 1.0).eq(2).all()


def test_spread_drops_groups_older_than_max_age():
    ages, keep = impl("staleness", "spread")(1000, 9, torch.Generator().manual_seed(1), k=4, max_age=2)
    assert set(ages.tolist()) == {0, 1, 2, 3, 4}
    assert torch.equal(keep, ages <= 2)                                 # prime-rl: older than the bound dropped
    _, keep_all = impl("staleness", "spread")(50, 9, torch.Generator().manual_seed(1), k=4)
    assert keep_all.all()
    ages, keep = impl("staleness", "spread")(50, 0, torch.Generator().manual_seed(1), k=4, max_age=1)
    assert ages.eq(0).all() and keep.all()                              # step 1: all fresh, none dropped


# ---------------------------------------------------------------- exact staleness (prime-rl 2441fd514)
def test_exact_staleness_is_prime_rls_in_flight_plus_in_queue():
    from grpo_ablate.tricks.staleness import split_ages
    # prime-rl orchestrator/utils.py episode_staleness, by hand: batch `step` trains v{step-1}; a group
    # dispatched at v3 whose generation ended on v4, shipped in batch 7: total 6 - 3 = 3, in_flight
    # min(3, 4 - 3) = 1, in_queue 2; min_fresh_version(7, 2) = 4 > 3: the sink voids it
    ages, keep, queued = split_ages(torch.tensor([1]), torch.tensor([2]), 9, 2)
    assert (ages.tolist(), keep.tolist(), queued.tolist()) == ([3], [False], [2])
    flight, wait = torch.tensor([0, 2, 1, 2, 0, 1]), torch.tensor([0, 0, 2, 1, 3, 1])
    ages, keep, queued = split_ages(flight, wait, 9, 2)
    assert ages.tolist() == [0, 2, 3, 3, 3, 2] and queued.tolist() == [0, 0, 2, 1, 3, 1]
    assert keep.tolist() == [True, True, False, False, False, True]     # queue time counted (2441fd514)
    _, keep, _ = split_ages(flight, wait, 9, 2, "in_flight")
    assert keep.all()                                                  # before it: the queue never ages a group
    _, keep, _ = split_ages(flight, wait, 9, 1, "in_flight")
    assert keep.tolist() == [True, False, True, False, True, True]
    # two older policies kept so far: totals clamped to 2, the in-flight part first (min(total, span))
    ages, keep, queued = split_ages(flight, wait, 2, 2)
    assert ages.tolist() == [0, 2, 2, 2, 2, 2] and queued.tolist() == [0, 0, 1, 0, 2, 1] and keep.all()
    _, keep_all, _ = split_ages(flight, wait, 9, None)
    assert keep_all.all()
    # the option: both parts drawn from the step's generator (in flight first), seeded
    draws = torch.Generator().manual_seed(3)
    expect = split_ages(torch.randint(0, 3, (64,), generator=draws), torch.randint(0, 2, (64,), generator=draws),
                        9, 2)
    got = impl("staleness", "exact")(64, 9, torch.Generator().manual_seed(3), k=2, queue=1, max_age=2)
    assert all(torch.equal(a, b) for a, b in zip(got, expect))
    assert set(got[0].tolist()) == {0, 1, 2, 3}


# ---------------------------------------------------------------- pacing (tinker-cookbook PR #822)
def tinker_fast_sampler_ages(groups_per_batch, depth, steps):
    """tinker-cookbook 1975ad25 `do_async_training` with rollouts that finish at once: workers start
    rollouts on the current sampler while fewer than groups_per_batch * (depth + 1) are outstanding;
    each step trains the stalest groups_per_batch, publishes sampler i + 1, then frees their slots."""
    capacity, version, outstanding, buffer, ages = groups_per_batch * (depth + 1), 0, 0, [], []
    for i in range(steps):
        while outstanding < capacity:
            buffer.append(version)
            outstanding += 1
        buffer.sort()
        batch, buffer = buffer[:groups_per_batch], buffer[groups_per_batch:]
        ages.append([i - v for v in batch])
        version, outstanding = i + 1, outstanding - groups_per_batch
    return ages


def test_paced_staleness_is_tinkers_pipeline_depth_and_deadline_wait():
    from grpo_ablate.tricks.staleness import paced_schedule
    # a fast sampler fills the pipeline: the history fills up, then every group is `depth` old
    assert tinker_fast_sampler_ages(2, 2, 5) == [[0, 0], [1, 1], [2, 2], [2, 2], [2, 2]]
    paced = impl("staleness", "paced")
    for step in range(1, 6):                              # step s keeps s - 1 older policies
        ages, keep = paced(2, step - 1, torch.Generator().manual_seed(step), k=4, depth=2, max_age=3,
                           straggle_frac=0.0)
        assert ages.tolist() == tinker_fast_sampler_ages(2, 2, 5)[step - 1] and keep.all()
    # stragglers (depth 1, bound 2): natural ages 3 and 4 wait for their deadline (trained at 2), or
    # are dropped before #822
    straggler = torch.tensor([False, True, True, True, False])
    slow = torch.tensor([3, 2, 4, 3, 2])
    ages, keep = paced_schedule(straggler, slow, 1, 9, 2, "wait")
    assert ages.tolist() == [1, 2, 2, 2, 1] and keep.all()
    ages, keep = paced_schedule(straggler, slow, 1, 9, 2, "drop")
    assert ages.tolist() == [1, 2, 4, 3, 1] and keep.tolist() == [True, True, False, False, True]
    ages, keep = paced_schedule(straggler, slow, 1, 0, 2, "drop")    # step 1: all fresh
    assert ages.eq(0).all() and keep.all()
    # the option draws straggler first, then every group's slow age in depth+1..k
    ages, keep = paced(2000, 9, torch.Generator().manual_seed(5), k=4, depth=1, max_age=2, straggle_frac=0.25)
    assert set(ages.tolist()) == {1, 2} and keep.all()
    assert abs((ages == 2).double().mean().item() - 0.25) < 0.04
    ages, keep = paced(2000, 9, torch.Generator().manual_seed(5), k=4, depth=1, max_age=2, straggle_frac=0.25,
                       strategy="drop")
    assert set(ages.tolist()) == {1, 2, 3, 4} and torch.equal(keep, ages <= 2)
    assert abs((~keep).double().mean().item() - 0.25 * 2 / 3) < 0.04


# ---------------------------------------------------------------- proximal policy (AReaL)
MU = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -3.0, 0.0]], dtype=D)     # behaviour (sampler)
OLD = torch.tensor([[-1.2, -1.0, -0.5], [-0.1, -2.0, -9.0]], dtype=D)   # pi_old (proximal, recomputed)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)


def test_loglinear_proximal_is_areals_interpolation():
    # AReaL compute_prox_logp_approximations: v_prox = v_theta - 1, alpha = (v_prox - v_mu) / (v_theta - v_mu);
    # behaviour 2 versions behind pi_prox -> alpha = 2 / 3 with versions=next (tests/test_proximal.py
    # has AReaL's own mapping, the default); log p_prox = log mu + alpha (log p_theta - log mu)
    ages = torch.tensor([[2], [0]])
    got, metrics = impl("proximal", "loglinear")(OLD, MU, ages, MASK, versions="next")
    a = 2 / 3
    expected = [[-1.0 + a * (-1.2 + 1.0), -2.0 + a * (-1.0 + 2.0), -0.5],
                [-0.2, -3.0, -9.0]]            # age 0: alpha 0, mu itself; the padding keeps pi_old's
    torch.testing.assert_close(got, torch.tensor(expected, dtype=D))
    assert metrics["proximal/gap"] > 0


def test_recompute_hands_pi_old_on_and_behaviour_takes_mu():
    same, metrics = impl("proximal", "recompute")(OLD, MU, torch.zeros(2, 1), MASK)
    assert same is OLD and metrics == {}
    got, _ = impl("proximal", "behaviour")(OLD, MU, torch.zeros(2, 1), MASK)
    torch.testing.assert_close(got, torch.where(MASK > 0, MU, OLD))


# ---------------------------------------------------------------- decoupled PPO and M2PO (AReaL)
def test_decoupled_weights_are_areals_masked_behaviour_ratio():
    # AReaL apply_rejection_sampling (token, mask, ratio, upper 5): w = pi_prox / mu, 0 where w > 5
    prox = torch.tensor([[-1.0, 0.0, -2.0]], dtype=D)
    mu = torch.tensor([[-1.5, -2.0, -1.0]], dtype=D)
    weights, metrics = impl("rollout_correction", "decoupled")(prox, mu, torch.ones(1, 3, dtype=D))
    expected = [[math.exp(0.5), 0.0, math.exp(-1.0)]]        # e^2 = 7.39 > 5: masked
    torch.testing.assert_close(weights, torch.tensor(expected, dtype=D))
    assert metrics["rollout_corr/masked_frac"] == pytest.approx(1 / 3)


def test_m2po_masks_the_largest_second_moments_until_the_mean_is_below_the_threshold():
    # AReaL _get_m2po_loss_mask: M2 = (log mu - log prox)^2 = [0.25, 0.01, 0.04, 0.0009] -> sorted
    # [0.25, 0.04, 0.01, 0.0009], suffix means [0.0752, 0.0170, 0.0055, 0.0009]: the first below 0.04 is
    # index 1, so one token (M2 = 0.25) is masked
    prox = torch.zeros(1, 5, dtype=D)
    mu = torch.tensor([[0.5, -0.1, 0.2, 0.03, 7.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]], dtype=D)          # the padding's huge gap is not counted
    weights, metrics = impl("rollout_correction", "m2po")(prox, mu, mask, threshold=0.04, denominator="trained")
    assert weights.tolist() == [[0.0, 1.0, 1.0, 1.0, 0.0]]
    assert metrics["rollout_corr/masked_frac"] == pytest.approx(0.25)
    assert metrics["rollout_corr/m2"] == pytest.approx((0.25 + 0.01 + 0.04 + 0.0009) / 4)
    assert metrics["rollout_corr/m2_kept"] == pytest.approx((0.01 + 0.04 + 0.0009) / 3)
    # every suffix mean above the threshold: all but the smallest masked (AReaL keeps one token)
    weights, _ = impl("rollout_correction", "m2po")(prox, mu, mask, threshold=1e-6, denominator="trained")
    assert weights.tolist() == [[0.0, 0.0, 0.0, 1.0, 0.0]]
    # no mismatch: nothing masked
    weights, metrics = impl("rollout_correction", "m2po")(prox, prox, mask)
    assert torch.equal(weights, mask) and metrics["rollout_corr/masked_frac"] == 0


# ---------------------------------------------------------------- the trainer
def run(overrides, run_dir):
    return train(compose(overrides), run_dir, overrides)


def rows_of(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)}
            for r in read_rows(run_dir / "metrics.jsonl")]


def test_stale_rollouts_reach_the_corrections_and_resume_exactly(small, tmp_path):
    args = small + ["staleness=fixed", "staleness.k=2", "rollout_correction=decoupled", "optim.lr=1e-3"]
    rows = rows_of(run(args, tmp_path / "full").run_dir)[1:]
    assert [r["staleness/mean_age"] for r in rows] == [0, 1, 2, 2]       # the history fills up first
    assert rows[0]["staleness/behaviour_kl"] == pytest.approx(0, abs=1e-5)   # step 1: the current policy sampled
    assert all(r["staleness/behaviour_k3"] > 1e-6 for r in rows[1:])      # then an older one
    assert all(r["rollout_corr/logp_diff_mean"] > 1e-4 for r in rows[1:])  # pi_prox / mu moves off 1
    run([*args, "steps=2"], tmp_path / "part")                             # the weight history is checkpointed
    run(args + ["resume=true"], tmp_path / "part")
    assert rows_of(tmp_path / "part")[1:] == rows


def test_mixed_and_spread_staleness_drop_and_mix(small, tmp_path):
    spread = ["staleness=spread", "staleness.k=3", "staleness.max_age=1", "rollout.prompts_per_step=8",
              "rollout_correction=m2po"]
    rows = rows_of(run(small + spread, tmp_path / "spread").run_dir)[1:]
    assert any(r["staleness/dropped_frac"] > 0 for r in rows) and all(r["staleness/max_age"] <= 1 for r in rows)
    assert all("rollout_corr/masked_frac" in r for r in rows)
    rows = rows_of(run(small + ["staleness=mixed", "staleness.stale_frac=0.5", "proximal=loglinear"],
                       tmp_path / "mixed").run_dir)[1:]
    assert any(0 < r["staleness/stale_frac"] < 1 for r in rows[1:])
    assert any(r["proximal/gap"] > 0 for r in rows)


def test_exact_and_paced_staleness_train_and_report_their_parts(small, tmp_path):
    exact = ["staleness=exact", "staleness.k=1", "staleness.queue=2", "staleness.max_age=2",
             "rollout.prompts_per_step=8"]
    rows = rows_of(run(small + exact, tmp_path / "exact").run_dir)[1:]
    assert all(r["staleness/max_age"] <= 2 for r in rows) and any(r["staleness/dropped_frac"] > 0 for r in rows)
    assert all(r["staleness/in_flight_max"] <= 1 and r["staleness/in_queue_max"] <= 2 for r in rows)
    assert all(r["staleness/in_flight_mean"] + r["staleness/in_queue_mean"] == pytest.approx(r["staleness/mean_age"])
               for r in rows)
    paced = ["staleness=paced", "staleness.straggle_frac=0.5", "rollout.prompts_per_step=8"]
    rows = rows_of(run(small + paced, tmp_path / "paced").run_dir)[1:]
    assert all(r["staleness/max_age"] <= 2 and r["staleness/dropped_frac"] == 0 for r in rows)
    assert rows[0]["staleness/mean_age"] == 0 and all(r["staleness/mean_age"] >= 1 for r in rows[2:])
    assert not any(k.startswith("staleness/in_") for r in rows for k in r)


@pytest.mark.parametrize("override, needle", [
    ("staleness=laggy", "staleness=laggy"),
    ("staleness=fixed staleness.k=0", "staleness.k"),
    ("staleness=mixed staleness.stale_frac=1.5", "staleness.stale_frac"),
    ("staleness=spread staleness.k=2 staleness.max_age=3", "staleness.max_age"),
    ("staleness=exact staleness.bound=queue", "staleness.bound"),
    ("staleness=exact staleness.queue=-1", "staleness.queue"),
    ("staleness=paced staleness.depth=3 staleness.max_age=2", "staleness.depth"),
    ("staleness=paced staleness.k=2 staleness.max_age=3", "staleness.max_age"),
    ("staleness=paced staleness.strategy=pace", "staleness.strategy"),
    ("proximal=guess", "proximal=guess"),
    ("rollout_correction=m2po rollout_correction.threshold=-1", "rollout_correction.threshold"),
    ("staleness=fixed rollout=vllm", "rollout=hf"),
])
def test_bad_async_settings_are_one_line_exit_2_and_no_run_dir(tmp_path, override, needle):
    refused_train(override, needle, tmp_path)


NEW_PRESETS = {
    "prime_rl": {"adv": "dr_grpo", "clip": "dppo", "loss_agg": "token_mean", "kl": "none", "staleness": "fixed",
                 "proximal": "behaviour"},
    "scalerl_bf16": {"adv": "lite", "clip": "cispo_trl", "loss_agg": "prompt_mean", "kl": "none", "lm_head": "fp32",
                     "prompt_pool": "no_positive_resampling"},
}


@pytest.mark.parametrize("preset", sorted(NEW_PRESETS))
def test_framework_presets_compose_and_validate(preset):
    from grpo_ablate.config.validate import validate
    cfg = compose([f"preset={preset}"])
    validate(cfg)
    assert {family: cfg[family].name for family in NEW_PRESETS[preset]} == NEW_PRESETS[preset]
    assert preset != "prime_rl" or (cfg.clip.kl_tau == 1e-3 and cfg.staleness.k == 1)
    assert preset != "scalerl_bf16" or cfg.model.dtype == "bfloat16"


def test_prime_rl_preset_trains_off_policy(small, tmp_path):
    rows = rows_of(run(small + ["preset=prime_rl", "steps=3", "optim.lr=1e-3"], tmp_path / "run").run_dir)[1:]
    assert [r["staleness/mean_age"] for r in rows] == [0, 1, 1]
    assert rows[-1]["ppo/kl"] != 0 and rows[-1]["proximal/gap"] > 0      # the ratio is against mu: it moves
