"""optim.schedule: the learning rate after the warm-up, constant or decayed to 0 at the last step
(Hugging Face's linear and cosine schedules with warm-up), and its one-line refusal."""
import math

import pytest

from conftest import refused_train
from grpo_ablate.train.run import lr_factor


def test_constant_is_the_warm_up_then_one():
    assert [lr_factor(s, 0, 10, "constant") for s in range(3)] == [1.0, 1.0, 1.0]
    assert [lr_factor(s, 4, 10, "constant") for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_linear_and_cosine_decay_from_the_peak_to_zero_after_the_warm_up():
    steps, warmup = 30, 0
    linear = [lr_factor(s, warmup, steps, "linear") for s in range(steps + 1)]
    assert linear[0] == 1.0 and linear[15] == pytest.approx(0.5) and linear[-1] == 0.0
    assert all(a > b for a, b in zip(linear, linear[1:]))
    cosine = [lr_factor(s, warmup, steps, "cosine") for s in range(steps + 1)]
    assert cosine[0] == 1.0 and cosine[15] == pytest.approx(0.5) and cosine[-1] == pytest.approx(0.0, abs=1e-12)
    assert cosine[5] == pytest.approx(0.5 * (1 + math.cos(math.pi * 5 / 30)))
    # with a warm-up of 5: up over the first 5 rollouts, then down over the other 25 (HF's schedules)
    warm = [lr_factor(s, 5, 30, "linear") for s in range(31)]
    assert warm[:5] == [0.2, 0.4, 0.6, 0.8, 1.0] and warm[5] == 1.0 and warm[30] == 0.0
    assert warm[10] == pytest.approx(1 - 5 / 25)


def test_an_unknown_schedule_is_one_line(tmp_path):
    refused_train("optim.schedule=step", "optim.schedule", tmp_path)


def test_resuming_a_decayed_run_with_other_steps_says_the_schedule_changed(small, tmp_path):
    from conftest import cli

    args = [o for o in small if not o.startswith(("steps=", "optim.schedule="))] + [
        "optim.schedule=linear", "checkpoint_every=1", f"hydra.run.dir={tmp_path / 'run'}"]
    assert cli("train", *args, "steps=2", cwd=tmp_path).returncode == 0
    again = cli("train", "--resume", str(tmp_path / "run"), "steps=3", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "note: optim.schedule=linear decays the lr to 0 at the run's last step, which was 2 and is now 3" \
        in again.stdout
    same = cli("train", "--resume", str(tmp_path / "run"), "steps=3", cwd=tmp_path)   # finished: nothing to say
    assert same.returncode == 0 and "note: optim.schedule" not in same.stdout
