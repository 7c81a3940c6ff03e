"""Family `sampling`, SkyRL's replace sampling (`sampling=replace`: flat groups replaced by copies of
varied ones), worked by hand from SkyRL skyrl/train/utils/trainer_utils.py `handle_replace_sampling`,
`get_bad_sample_replacements` (commit a9564572eb8e91076be43c1bd5e4615e3de17265).
"""

import pytest
import torch

from conftest import refused_train
from grpo_ablate.sampling.decode import Rollout
from grpo_ablate.tricks import option

D = torch.float64


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


# a bad value of each knob, as a user meets it: one `error:` line, exit 2, nothing written
@pytest.mark.parametrize("overrides, needle", [
    ("sampling=replace sampling.min_replace_ratio=2", "sampling.min_replace_ratio"),
])
def test_a_bad_sampling_value_is_one_line_exit_2_and_no_run_dir(tmp_path, overrides, needle):
    refused_train(overrides, needle, tmp_path)
