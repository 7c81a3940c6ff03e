"""Family `loss_agg`, the weights of prompt_mean against SkyRL's, in float64, worked by hand."""
import pytest
import torch

from grpo_ablate.tricks import option

D = torch.float64


def test_prompt_mean_weights_are_skyrls():
    # two prompts: group 0 has lengths 4 and 2 (6 tokens), group 1 lengths 1 and 3 (4 tokens)
    mask = torch.zeros(4, 4, dtype=D)
    for row, n in enumerate([4, 2, 1, 3]):
        mask[row, :n] = 1
    w = option("loss_agg", "prompt_mean").impl(mask, 4, torch.tensor([0, 0, 1, 1]))
    # SkyRL prompt_mean: 1 / (num_prompts * tokens_in_prompt)
    expected = mask * torch.tensor([[1 / 12], [1 / 12], [1 / 8], [1 / 8]], dtype=D)
    torch.testing.assert_close(w, expected)
    assert w.sum().item() == pytest.approx(1.0)
    # a prompt with no trained token is left out of P
    mask[2:] = 0
    w = option("loss_agg", "prompt_mean").impl(mask, 4, torch.tensor([0, 0, 1, 1]))
    assert w.sum().item() == pytest.approx(1.0) and w[2:].abs().sum() == 0
