"""Family `optim_state`: slime's stateless Adam (moments reset after every optimizer step) and its
--reset-optimizer-states (after every rollout), against Adam by hand in float64: slime
slime/backends/megatron_utils/stateless_adam.py `StatelessAdam.step` and model.py's
--reset-optimizer-states block (commit 624b824a898ab0ec1fcb4d373004c7f3852bf515); Adam as
torch.optim.AdamW documents it.
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


def test_optimizer_resets_count_in_a_run(small, tmp_path):
    for every, resets in (("step", [2, 4]), ("rollout", [1, 2])):
        overrides = small + ["steps=2", "updates=mini_batches", "updates.mini_batches=2",
                             f"+trick={'stateless_adam' if every == 'step' else 'reset_optimizer_states'}"]
        train(compose(overrides), tmp_path / every, overrides)
        rows = read_rows(tmp_path / every / "metrics.jsonl")[1:]
        assert [r["optim/state_resets"] for r in rows] == resets


# a bad value of each knob, as a user meets it: one `error:` line, exit 2, nothing written
@pytest.mark.parametrize("overrides, needle", [
    ("optim_state=reset optim_state.every=epoch", "optim_state.every"),
])
def test_a_bad_optim_state_value_is_one_line_exit_2_and_no_run_dir(tmp_path, overrides, needle):
    refused_train(overrides, needle, tmp_path)
