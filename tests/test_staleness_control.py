"""Family `staleness`, verl's v1 staleness control (`strategy=drop|wait` with `max_age`): verl's replay
buffer (trainer.v1.sampler.max_off_policy_threshold / max_off_policy_strategy:
`_drop_max_off_policy_samples` drops global_steps - step + 1 > T, `_has_enough_samples` waits while an
in-flight group has reached T), as read in the index (verl main, 2026).
"""

import pytest
import torch

from conftest import refused_train
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.rundir.files import read_rows
from grpo_ablate.train.grpo import train
from grpo_ablate.tricks import option

D = torch.float64


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


def test_staleness_wait_trains_no_group_older_than_max_age(small, tmp_path):
    overrides = small + ["steps=3", "+trick=staleness_wait", "staleness.max_age=0"]
    train(compose(overrides), tmp_path / "run", overrides)
    rows = read_rows(tmp_path / "run" / "metrics.jsonl")[1:]
    assert all(r["staleness/max_age"] == 0 and r["staleness/dropped_frac"] == 0 for r in rows)


def test_the_named_trick_composes():
    cfg = compose(["+trick=staleness_wait"])
    validate(cfg)
    assert (cfg.staleness.name, cfg.staleness.max_age, cfg.staleness.strategy) == ("spread", 2, "wait")


@pytest.mark.parametrize("overrides, message", [
    (["staleness=spread", "staleness.strategy=wait"], "staleness.strategy=wait caps the ages"),
])
def test_bad_staleness_settings_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(overrides))


# a bad value of each knob, as a user meets it: one `error:` line, exit 2, nothing written
@pytest.mark.parametrize("overrides, needle", [
    ("staleness=spread staleness.strategy=block", "staleness.strategy"),
])
def test_a_bad_staleness_value_is_one_line_exit_2_and_no_run_dir(tmp_path, overrides, needle):
    refused_train(overrides, needle, tmp_path)
