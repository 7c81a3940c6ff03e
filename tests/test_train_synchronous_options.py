"""The trainer side of the synchronous options (the replay buffer, ReMax, the zero-variance
filter, the fp32 head): ReMax's greedy baseline reaches the advantage, zero-variance groups are
dropped without a refill, the fp32 head trains."""
import pytest

from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.rundir.files import read_rows
from grpo_ablate.train.grpo import train


def rows_of(overrides, run_dir):
    train(compose(overrides), run_dir, overrides)
    return read_rows(run_dir / "metrics.jsonl")[1:]


def test_remax_zero_variance_filter_prompt_mean_and_fp32_head_train(small, tmp_path):
    rows = rows_of(small + ["steps=2", "adv=remax", "+trick=zero_variance_filter", "loss_agg=prompt_mean",
                            "lm_head=fp32", "+model.dtype=bfloat16"], tmp_path / "run")
    assert all(r["sampling/rounds"] == 1 for r in rows)                      # never refilled
    assert any(r["sampling/kept_group_frac"] < 1 for r in rows)              # flat groups dropped
    assert all(r["loss"] is not None and r["adv/std"] > 0 for r in rows)


@pytest.mark.parametrize("overrides, message", [
    (["adv=remax", "reward_norm=batch"], "adv=remax subtracts the greedy completion's raw reward"),
    (["adv=remax", "diag.grad_conflict=true"], "adv=remax needs its greedy baseline"),
    (["adv=maxrl", "adv.eps=0"], "adv.eps"),
    (["clip=dppo", "clip.divergence=tv"], "clip.divergence"),
    (["clip=vespo", "clip.lambda_pos=0"], "clip.lambda_pos"),
    (["lm_head=fp16"], "lm_head=fp16"),
    (["loss_agg=prompt_sum"], "loss_agg=prompt_sum"),
])
def test_bad_remax_loss_and_head_settings_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(overrides))


def test_replay_buffer_refills_flat_groups_as_trl():
    import torch
    from grpo_ablate.sampling.decode import Rollout
    from grpo_ablate.train.state.sampling import ReplayBuffer
    from grpo_ablate.train.batch import SampledGroups

    def batch(scores, width):
        n = len(scores)
        roll = Rollout(torch.arange(n * (2 + width)).view(n, 2 + width), torch.ones(n, 2 + width, dtype=torch.long),
                       2, torch.ones(n, width), torch.zeros(n, dtype=torch.bool), torch.full((n, width), -0.5))
        groups = n // 2
        return SampledGroups(roll, [f"p{g}" for g in range(groups)], [f"t{i}" for i in range(n)],
                             torch.tensor(scores, dtype=torch.float32), torch.arange(groups).repeat_interleave(2), 1)

    buffer = ReplayBuffer(size=2, seed=0)
    first = buffer.after_sampling(batch([1, 0, 1, 1, 0, 1], 3), step=1, pad_id=0)   # groups 0, 2 informative; 1 flat
    assert first.replayed == 1 and first.problems[:2] == ["p0", "p2"] and first.problems[2] in ("p0", "p2")
    assert first.roll.ages.tolist() == [0, 0, 0, 0, 0, 0]                  # replayed from this very step
    # TRL's score: sum_j |A_j| * std_g; two members 1, 0: std 0.707, A = +-0.5 / (0.707 + 1e-4)
    std = 2 ** -0.5
    assert buffer.heap[0][0] == pytest.approx(2 * 0.5 / (std + 1e-4) * std)
    second = buffer.after_sampling(batch([0, 0, 1, 1], 5), step=4, pad_id=0)   # both flat: two from the buffer
    assert second.replayed == 2 and second.roll.ages.tolist() == [3, 3, 3, 3]
    assert second.roll.completion_mask.shape[1] == 3 and second.scores.sum() == 2   # the stored groups' own
    state = buffer.state_dict()
    again = ReplayBuffer(size=2, seed=0)
    again.load_state_dict(state)
    assert [e[0] for e in again.heap] == [e[0] for e in buffer.heap]


def test_replay_buffer_trains_and_reports_the_replayed_ages(small, tmp_path):
    rows = rows_of(small + ["steps=3", "sampling=replay"], tmp_path / "run")
    assert any(r["sampling/replayed_groups"] > 0 for r in rows)
    assert all("staleness/mean_age" in r for r in rows if r["sampling/replayed_groups"] > 0)
