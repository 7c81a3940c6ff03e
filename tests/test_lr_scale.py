"""Family `lr_scale`, VCPO's ESS learning-rate scaling, worked by hand from VCPO (mit-han-lab/vcpo, commit
c7f030f0b77237cfb0e75e720669e2917a1bb56e): recipe/fully_async_policy/staleness_utils.py `compute_ess_info`,
verl/workers/actor/megatron_actor.py's ess_scaling block.
"""
import math

import pytest
import torch

from conftest import refused_train
from grpo_ablate.config.compose import compose
from grpo_ablate.rundir.files import read_rows
from grpo_ablate.train.grpo import train
from grpo_ablate.tricks import option

D = torch.float64


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


# a bad value of each knob, as a user meets it: one `error:` line, exit 2, nothing written
@pytest.mark.parametrize("overrides, needle", [
    ("lr_scale=ess lr_scale.rule=log", "lr_scale.rule"),
    ("lr_scale=ess lr_scale.base_ess_ratio=0", "lr_scale.base_ess_ratio"),
])
def test_a_bad_lr_scale_value_is_one_line_exit_2_and_no_run_dir(tmp_path, overrides, needle):
    refused_train(overrides, needle, tmp_path)
