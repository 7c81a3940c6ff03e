"""The trainer side of issue 25's non-async options: ReMax's greedy baseline reaches the
advantage, zero-variance groups are dropped without a refill, the fp32 head trains."""
import pytest

from grpo_ablate.config import ConfigError, compose, validate
from grpo_ablate.rundir import read_rows
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
def test_bad_settings_of_issue_25_options_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(overrides))
