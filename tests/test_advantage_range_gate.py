"""prime-rl's advantage-range gate (sampling=advantage_range), and every
new knob's bad value as one `error:` line, exit 2, nothing written (the CLI, as a user meets it)."""
import pytest
import torch

from conftest import refused_train
from grpo_ablate.tricks import option

D = torch.float64


def test_advantage_range_gate_is_prime_rls_admission_rule():
    # prime-rl AdvRangeGate.admit (src/prime_rl/orchestrator/curriculum/gates/adv.py, 559b447): reject a
    # group when every advantage lies in [reject_min, reject_max]; advantages r - mean(r) of the group
    gate = option("sampling", "advantage_range").impl
    scores = torch.tensor([[1.0, 1.0, 1.0, 1.0],      # A = 0 everywhere: rejected by [0, 0]
                           [1.0, 0.0, 0.0, 0.0],      # A = (.75, -.25, -.25, -.25): kept
                           [0.52, 0.48, 0.5, 0.5]],   # A = (.02, -.02, 0, 0): kept by [0, 0], rejected by +-0.05
                          dtype=D)
    assert gate(scores).tolist() == [False, True, True]
    assert gate(scores, reject_min=-0.05, reject_max=0.05).tolist() == [False, True, False]
    assert gate(scores, reject_min=-0.3, reject_max=0.8).tolist() == [False, False, False]


@pytest.mark.parametrize("overrides, needle", [
    ("rollout_correction=rejection rollout_correction.metric=k4", "rollout_correction.metric"),
    ("rollout_correction=rejection rollout_correction.aggregation=median", "rollout_correction.aggregation"),
    ("rollout_correction=m2po rollout_correction.denominator=all", "rollout_correction.denominator"),
    ("proximal=loglinear proximal.versions=v2", "proximal.versions"),
    ("clip=dro clip.beta=-1", "clip.beta"),
    ("clip=rollout_is clip.eps_high=0", "clip.eps_high"),
    ("clip=dppo clip.divergence=ipo", "clip.divergence"),
    ("sampling=advantage_range sampling.reject_min=0.5", "sampling.reject_max"),
])
def test_a_bad_value_of_every_new_knob_is_one_line_exit_2_and_no_run_dir(tmp_path, overrides, needle):
    refused_train(overrides, needle, tmp_path)
