"""Family `loss_agg`: the weights of prompt_mean against SkyRL's, and of turn_mean (each policy turn of a
multi-turn episode weighs the same) by hand, in float64."""
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


# --------------------------------------------------------------------------------------- turn_mean
# row 0: an episode of three policy turns with the tool's replies between them ("P" the policy's, "R" the
# reply, which belongs to the turn it answers): P P R R | P R | P P; row 1: one policy turn of 3 tokens; row 2:
# an episode cut by the turn budget and masked out whole (overlong=filter): no trained token
TURN_INDEX = torch.tensor([[0, 0, 0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 0]])
COMPLETION = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]], dtype=D)
SAMPLED = torch.tensor([[1, 1, 0, 0, 1, 0, 1, 1], [1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 1, 1, 1, 0]], dtype=D)
ADVANTAGE = torch.tensor([[1.0], [-0.5], [2.0]], dtype=D)


def turn_mean_loss(mask):
    """(weights, loss, d loss / d log pi) of the on-policy surrogate -A r_t under turn_mean."""
    logp = torch.tensor([[-0.3, -1.2, -2.0, -0.7, -0.1, -0.4, -0.8, -0.2]] * 3, dtype=D, requires_grad=True)
    w = option("loss_agg", "turn_mean").impl(mask, 8, torch.tensor([0, 0, 1]), TURN_INDEX)
    loss = (-ADVANTAGE * torch.exp(logp - logp.detach()) * w).sum()
    loss.backward()
    return w, loss.item(), logp.grad


def test_turn_mean_weighs_each_policy_turn_the_same_by_hand():
    # env_mask=masked: turns of 2, 1 and 2 policy tokens in row 0, 3 in row 1, none in row 2: K = 4 turns,
    # w = 1 / (K n_turn) -- SkyRL step-wise sequence_mean over the 4 per-turn sequences, A / (4 * their tokens)
    w, loss, grad = turn_mean_loss(COMPLETION * SAMPLED)
    expected = torch.tensor([[1 / 8, 1 / 8, 0, 0, 1 / 4, 0, 1 / 8, 1 / 8], [1 / 12] * 3 + [0] * 5, [0] * 8], dtype=D)
    torch.testing.assert_close(w, expected, rtol=0, atol=1e-15)
    # L = -sum_jt w A: row 0's turns carry 3/4 of the weight (3 of the 4 turns), row 1's one turn 1/4
    assert loss == pytest.approx(-(3 / 4 * 1.0 + 1 / 4 * -0.5), abs=1e-15)
    torch.testing.assert_close(grad, -ADVANTAGE * expected, rtol=0, atol=1e-15)   # the replies get no gradient
    # token_mean would give each of the 8 tokens 1/8, seq_mean_token_mean row 0's 5 tokens 1/10 each: the
    # one-token turn 1 weighs as much as each two-token turn here
    # env_mask=unmasked: the replies count in the turn they answer (turns of 4, 2 and 2 tokens)
    w, _, grad = turn_mean_loss(COMPLETION)
    expected = torch.tensor([[1 / 16] * 4 + [1 / 8] * 4, [1 / 12] * 3 + [0] * 5, [0] * 8], dtype=D)
    torch.testing.assert_close(w, expected, rtol=0, atol=1e-15)
    torch.testing.assert_close(grad, -ADVANTAGE * expected, rtol=0, atol=1e-15)


def test_turn_lengths_count_each_turns_trained_tokens():
    from grpo_ablate.tricks.loss_agg import turn_lengths

    expected = torch.tensor([[2, 1, 2], [3, 0, 0], [0, 0, 0]], dtype=D)
    torch.testing.assert_close(turn_lengths(COMPLETION * SAMPLED, TURN_INDEX), expected, rtol=0, atol=0)


def test_turn_mean_is_seq_mean_token_mean_on_single_turn_rows():
    """A single-completion task (no turn_index) or an episode of one turn: every row is one turn, so the
    weights are seq_mean_token_mean's, bit for bit."""
    torch.manual_seed(0)
    mask = (torch.rand(5, 7, dtype=D) < 0.7).to(D)
    mask[3] = 0                                                  # a row masked out is no turn and no sequence
    reference = option("loss_agg", "seq_mean_token_mean").impl(mask, 7)
    turn_mean = option("loss_agg", "turn_mean").impl
    assert torch.equal(turn_mean(mask, 7), reference)
    assert torch.equal(turn_mean(mask, 7, None, torch.zeros(5, 7, dtype=torch.long)), reference)


def test_turn_mean_is_inert_on_a_single_completion_task_only():
    from grpo_ablate.config.compose import compose

    inert = option("loss_agg", "turn_mean").inert[0].when
    assert inert(compose([])) and not inert(compose(["task=calculator"]))
