"""GAE on multi-turn episodes: the token-level recursion skips the environment's tokens (verl b178a3cd
`compute_gae_advantage_return`, #2337; AReaL 74c633476 `_compute_token_level_gae`), and turn-level GAE takes
each policy turn as one timestep (AReaL 74c633476 `_compute_turn_level_gae`, actor.gae_timestep_unit=turn).
Hand vectors in float64, worked below from those functions; on a single-turn task both are bit for bit what
they were before turns were read; the trainer supplies the rollout's `turn_index` and a real step on the
calculator keeps its advantages per turn, in micro-batches too."""
import pytest
import torch

from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.tricks import option
from grpo_ablate.tricks.adv.critic import (critic_returns, flexible_gae, gae, sample_lambda, timestep_lengths,
                                           token_rewards, turn_gae)

D = torch.float64

# Three trajectories, 7 tokens wide, gamma 0.9, lambda 0.8 (gamma lambda = 0.72):
#   row 0  a call (tokens 0-1, turn 0), the tool's reply (2-3, turn 0, not trained), the answer (4-5, turn 1)
#   row 1  an answer without the tool: one turn of 3 tokens
#   row 2  the turn budget ends it on a reply: a call (0-1), its reply (2), a call (3-4, turn 1), its reply (5)
# The values at replies and padding (9, 7, 5, 3) must not matter.
MASK = torch.tensor([[1, 1, 0, 0, 1, 1, 0],
                     [1, 1, 1, 0, 0, 0, 0],
                     [1, 1, 0, 1, 1, 0, 0]], dtype=D)
TURNS = torch.tensor([[0, 0, 0, 0, 1, 1, 0],
                      [0, 0, 0, 0, 0, 0, 0],
                      [0, 0, 0, 1, 1, 1, 0]])
VALUES = torch.tensor([[0.5, 0.4, 9.0, 9.0, 0.2, 0.1, 7.0],
                       [0.3, 0.6, 0.7, 5.0, 5.0, 5.0, 5.0],
                       [0.0, 0.1, 3.0, -0.4, 0.2, 3.0, 3.0]], dtype=D)
REWARDS = torch.tensor([1.0, 0.5, 1.0], dtype=D)
GAMMA, LAM = 0.9, 0.8


def test_the_outcome_reward_sits_on_the_last_trained_token():
    # row 2 ends on the tool's reply (token 5): its reward goes to the policy's last token, 4
    assert token_rewards(REWARDS, MASK).nonzero().tolist() == [[0, 5], [1, 2], [2, 4]]


def test_token_level_gae_skips_the_tools_reply_by_hand():
    adv, ret = gae(token_rewards(REWARDS, MASK), VALUES, MASK, GAMMA, LAM)
    # row 0, trained tokens 5, 4, 1, 0 (2-3 take no step: token 1's next value is token 4's):
    #   A5 = 1 - 0.1 = 0.9;  A4 = 0.9*0.1 - 0.2 + 0.72*0.9 = 0.538
    #   A1 = 0.9*0.2 - 0.4 + 0.72*0.538 = 0.16736;  A0 = 0.9*0.4 - 0.5 + 0.72*0.16736 = -0.0195008
    # row 1: A2 = 0.5 - 0.7 = -0.2;  A1 = 0.9*0.7 - 0.6 - 0.72*0.2 = -0.114;  A0 = 0.9*0.6 - 0.3 - 0.72*0.114 = 0.15792
    # row 2, trained 4, 3, 1, 0: A4 = 1 - 0.2 = 0.8;  A3 = 0.9*0.2 + 0.4 + 0.72*0.8 = 1.156
    #   A1 = 0.9*(-0.4) - 0.1 + 0.72*1.156 = 0.37232;  A0 = 0.9*0.1 - 0 + 0.72*0.37232 = 0.3580704
    want = torch.tensor([[-0.0195008, 0.16736, 0, 0, 0.538, 0.9, 0],
                         [0.15792, -0.114, -0.2, 0, 0, 0, 0],
                         [0.3580704, 0.37232, 0, 1.156, 0.8, 0, 0]], dtype=D)
    torch.testing.assert_close(adv, want)
    torch.testing.assert_close(ret, (want + VALUES) * MASK)
    # the recursion that ran through the reply (its V counted as 0, gamma lambda decaying over it) differs;
    # at gamma = lambda = 1 both telescope to A_t = R - V_t (adv=gae's defaults: the skip changes nothing there)
    reward = token_rewards(REWARDS, MASK)
    assert not torch.allclose(adv[0], through_every_position(reward, VALUES, MASK, GAMMA, LAM)[0][0])
    torch.testing.assert_close(gae(reward, VALUES, MASK, 1.0, 1.0), through_every_position(reward, VALUES, MASK, 1.0,
                                                                                             1.0))
    torch.testing.assert_close(gae(reward, VALUES, MASK, 1.0, 1.0)[0], (REWARDS[:, None] - VALUES) * MASK)


def test_turn_level_gae_by_hand():
    adv, ret = turn_gae(token_rewards(REWARDS, MASK), VALUES, MASK, TURNS, GAMMA, LAM)
    # row 0: turn 1: r = 1, V = V4 = 0.2: A1 = 1 - 0.2 = 0.8
    #        turn 0: r = 0, V = V0 = 0.5: A0 = 0.9*0.2 - 0.5 + 0.72*0.8 = 0.256
    # row 1: one turn: A = 0.5 - V0 = 0.2
    # row 2: turn 1: r = 1 (token 4), V = V3 = -0.4: A1 = 1.4;  turn 0: A0 = 0.9*(-0.4) - 0 + 0.72*1.4 = 0.648
    want = torch.tensor([[0.256, 0.256, 0, 0, 0.8, 0.8, 0],
                         [0.2, 0.2, 0.2, 0, 0, 0, 0],
                         [0.648, 0.648, 0, 1.4, 1.4, 0, 0]], dtype=D)
    torch.testing.assert_close(adv, want)
    # the critic's target A_u + V_u on each token of turn u: 0.756 and 1.0; 0.5; 0.648 and 1.0
    torch.testing.assert_close(ret, torch.tensor([[0.756, 0.756, 0, 0, 1.0, 1.0, 0],
                                                  [0.5, 0.5, 0.5, 0, 0, 0, 0],
                                                  [0.648, 0.648, 0, 1.0, 1.0, 0, 0]], dtype=D))
    torch.testing.assert_close(critic_returns(REWARDS, MASK, VALUES, TURNS, gamma=GAMMA, lam=LAM, whiten=True,
                                              timestep="turn"), ret)


def test_a_trained_reply_belongs_to_the_turn_it_answers():
    """env_mask=unmasked: the reply's tokens are trained, as tokens of the turn they answer; V is still read
    at the turn's first token (the policy's) and the reward on the last trained token."""
    every = (TURNS >= 0).to(D) * torch.tensor([[1] * 6 + [0], [1] * 3 + [0] * 4, [1] * 6 + [0]], dtype=D)
    adv, ret = turn_gae(token_rewards(REWARDS, every), VALUES, every, TURNS, GAMMA, LAM)
    # row 2 now ends on its trained reply (token 5, turn 1): the same turns, the same sums
    torch.testing.assert_close(adv[2], torch.tensor([0.648, 0.648, 0.648, 1.4, 1.4, 1.4, 0], dtype=D))
    torch.testing.assert_close(adv[0], torch.tensor([0.256] * 4 + [0.8, 0.8, 0], dtype=D))
    torch.testing.assert_close(ret[0], torch.tensor([0.756] * 4 + [1.0, 1.0, 0], dtype=D))


def test_a_turn_without_a_trained_token_takes_no_step():
    # row 0 with its first turn masked out (as a whole trajectory is under overlong=filter, or a turn could be
    # under a future mask): turn 1 alone, A = 1 - 0.2 = 0.8; an empty row is all 0
    mask = MASK[:1].clone()
    mask[0, :2] = 0
    adv, ret = turn_gae(token_rewards(REWARDS[:1], mask), VALUES[:1], mask, TURNS[:1], GAMMA, LAM)
    torch.testing.assert_close(adv, torch.tensor([[0, 0, 0, 0, 0.8, 0.8, 0]], dtype=D))
    empty = torch.zeros_like(MASK[:1])
    assert not turn_gae(token_rewards(REWARDS[:1], empty), VALUES[:1], empty, TURNS[:1], GAMMA, LAM)[0].any()


def test_a_lambda_per_sample_counts_the_turns():
    # AReaL's turn_counts: 2, 1, 2 turns; an empty row 0
    rows = torch.cat([MASK, torch.zeros_like(MASK[:1])])
    turns = torch.cat([TURNS, TURNS[:1]])
    assert timestep_lengths(rows, "turn", turns).tolist() == [2, 1, 2, 0]
    assert timestep_lengths(rows, "turn").tolist() == [1, 1, 1, 0]           # without turns: one a row
    assert timestep_lengths(rows, "token", turns).tolist() == [4, 3, 4, 0]
    # relative_position q = 0.25: lambda 0.25^(1/(2-1)) = 0.25 on two turns, 1 on one
    assert sample_lambda(rows, lam_fn="relative_position", q=0.25, timestep="turn", turn_index=turns).tolist() == [
        0.25, 1.0, 0.25, 0.0]
    adv, _ = flexible_gae(token_rewards(REWARDS, MASK), VALUES, MASK, gamma=1.0, lam_fn="relative_position", q=0.25,
                          timestep="turn", turn_index=TURNS)
    # row 0: A1 = 0.8, A0 = 0.2 - 0.5 + 0.25*0.8 = -0.1;  row 1: 0.2;  row 2: A1 = 1.4, A0 = -0.4 + 0.25*1.4 = -0.05
    torch.testing.assert_close(adv, torch.tensor([[-0.1, -0.1, 0, 0, 0.8, 0.8, 0], [0.2, 0.2, 0.2, 0, 0, 0, 0],
                                                  [-0.05, -0.05, 0, 1.4, 1.4, 0, 0]], dtype=D))


def test_each_rows_result_is_its_own_whatever_the_batch_it_was_gathered_into():
    """Ranks sample shares of the batch, gathered right-padded (turn index 0, mask 0 on the padding): a row's
    advantages and targets before whitening are the same in its share at its own width as in the whole batch."""
    reward = token_rewards(REWARDS, MASK)
    for timestep in ("token", "turn"):
        whole = flexible_gae(reward, VALUES, MASK, gamma=GAMMA, lam=LAM, timestep=timestep, turn_index=TURNS)
        for rows, width in ((slice(0, 1), 6), (slice(1, 3), 5)):
            part = flexible_gae(reward[rows, :width], VALUES[rows, :width], MASK[rows, :width], gamma=GAMMA, lam=LAM,
                                timestep=timestep, turn_index=TURNS[rows, :width])
            for got, want in zip(part, whole):
                assert torch.equal(got, want[rows, :width]) and not want[rows, width:].any()


# ------------------------------------------------------------------------------------ single turn: as before
def through_every_position(token_reward, values, mask, gamma, lam):
    """Token-level GAE as it was before environment tokens were skipped: V and delta of a masked position
    counted as 0, gamma lambda decaying over it."""
    values = values * mask
    advantages = torch.zeros_like(values)
    running = torch.zeros(values.shape[0], dtype=values.dtype)
    for t in reversed(range(values.shape[1])):
        next_value = values[:, t + 1] if t + 1 < values.shape[1] else torch.zeros_like(running)
        running = token_reward[:, t] + gamma * next_value - values[:, t] + gamma * lam * running
        advantages[:, t] = running
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def one_step_a_row(token_reward, values, mask):
    """Turn-level GAE as it was before turns were read: a row one turn, A = R - V at its first trained token."""
    reward = (token_reward * mask).sum(dim=1)
    first = (mask > 0).to(torch.int64).argmax(dim=1)
    value = values.gather(1, first[:, None])[:, 0] * (mask.sum(dim=1) > 0).to(values.dtype)
    advantage = reward - value
    return advantage[:, None] * mask, (advantage + value)[:, None] * mask


def last_by_count(rewards, mask):
    """token_rewards as it was: the reward at index (trained tokens - 1)."""
    out = torch.zeros_like(mask, dtype=rewards.dtype)
    last = (mask.sum(dim=1).long() - 1).clamp(min=0)
    out[torch.arange(mask.shape[0]), last] = rewards * (mask.sum(dim=1) > 0).to(rewards.dtype)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_on_single_turn_completions_every_result_is_bit_for_bit_the_former_one(dtype):
    """A single-turn task's trained tokens are one run from the first (EOS included, padding after; a row
    masked out whole): token-level GAE, its critic targets, turn-level GAE (without a turn index, or with
    every token in turn 0) and the reward's position are exactly what they were."""
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([0, 1, 2, 5, 9, 13, 13, 7])
    mask = (torch.arange(13)[None, :] < lengths[:, None]).to(dtype)
    values = torch.randn(8, 13, generator=g, dtype=dtype)
    rewards = torch.randn(8, generator=g, dtype=dtype)
    reward = token_rewards(rewards, mask)
    assert torch.equal(reward, last_by_count(rewards, mask))
    for gamma, lam in ((1.0, 1.0), (0.99, 0.95), (0.9, 0.0)):
        assert all(map(torch.equal, gae(reward, values, mask, gamma, lam),
                       through_every_position(reward, values, mask, gamma, lam)))
        for turns in (None, torch.zeros(8, 13, dtype=torch.long)):
            assert all(map(torch.equal, turn_gae(reward, values, mask, turns, gamma, lam),
                           one_step_a_row(reward, values, mask)))
            assert all(map(torch.equal, flexible_gae(reward, values, mask, gamma=gamma, lam=lam, timestep="turn",
                                                     turn_index=turns), one_step_a_row(reward, values, mask)))
    lam = sample_lambda(mask, lam_fn="vapo", alpha=0.2)   # a lambda per row
    assert all(map(torch.equal, gae(reward, values, mask, 0.95, lam),
                   through_every_position(reward, values, mask, 0.95, lam)))


# ------------------------------------------------------------------------------ the estimator, the trainer
def test_the_advantage_chain_supplies_the_turns_to_the_estimator_that_reads_them():
    from grpo_ablate.config.spec import run_spec
    from grpo_ablate.train.rewards import AdvantageChain

    chain = AdvantageChain(run_spec(compose(["adv=gae", "adv.timestep=turn", "adv.gamma=0.9", "adv.lam=0.8",
                                             "adv.whiten=false", "task=calculator"])).tricks)
    torch.testing.assert_close(chain(REWARDS, None, MASK, VALUES, turn_index=TURNS).values,
                               turn_gae(token_rewards(REWARDS, MASK), VALUES, MASK, TURNS, GAMMA, LAM)[0])
    torch.testing.assert_close(chain.critic_returns(REWARDS, MASK, VALUES, TURNS),
                               turn_gae(token_rewards(REWARDS, MASK), VALUES, MASK, TURNS, GAMMA, LAM)[1])
    # an estimator that does not read them is called as ever (grpo's signature has no turn_index)
    grpo = AdvantageChain(run_spec(compose(["task=calculator"])).tricks)
    assert not grpo.reads_turns
    assert grpo(REWARDS, torch.tensor([0, 0, 0]), MASK, turn_index=TURNS).values.shape == (3,)
    assert option("adv", "gae").reads_turn_index and "turn_index" not in option("adv", "gae").config()


def test_a_lambda_schedule_over_turns_needs_a_multi_turn_task():
    validate(compose(["adv=gae", "adv.timestep=turn", "adv.lam_fn=vapo", "task=calculator"]))
    validate(compose(["+trick=turn_gae", "task=calculator", "adv.lam_fn=relative_position"]))
    with pytest.raises(ConfigError, match="does nothing with adv.timestep=turn on a single-turn task"):
        validate(compose(["adv=gae", "adv.timestep=turn", "adv.lam_fn=vapo"]))
    with pytest.raises(ConfigError, match=r"adv.turn_index is not a setting of adv=gae \(it is set by the trainer"):
        validate(compose(["adv=gae", "+adv.turn_index=0"]))


def test_the_named_trick_selects_turn_level_gae():
    cfg = compose(["+trick=turn_gae", "task=calculator"])
    validate(cfg)
    assert cfg.adv.name == "gae" and cfg.adv.timestep == "turn" and dict(cfg.tricks) == {
        "turn_gae": {"family": "adv", "option": "gae"}}


def calculator_trainer(cache_dir, *overrides):
    """A float64 trainer on the calculator's episodes, as tests/test_multi_turn.py's split test builds it (sdpa:
    in float64 the eager attention gives NaN on left-padded rows, and the calculator's prompts differ in length)."""
    from conftest import SMALL
    from grpo_ablate.config.spec import run_spec
    from grpo_ablate.train.distributed import DataParallel
    from grpo_ablate.train.grpo import build_grpo

    cfg = compose([o for o in SMALL if not o.startswith("task.")]
                  + ["task=calculator", "task.eval_size=8", "rollout.max_new_tokens=24",
                     "model.attn_implementation=sdpa",
                     f"model.cache_dir={cache_dir}", *overrides])
    validate(cfg)
    trainer, _ = build_grpo(run_spec(cfg), torch.device("cpu"), DataParallel(), None, lambda *a, **k: None)
    for model in (trainer.p.policy, trainer.p.reference, trainer.p.value_head):
        model.double()
    return trainer


def test_a_real_step_on_the_calculator_gives_each_turn_one_advantage(cache_dir):
    """adv=gae adv.timestep=turn on the calculator's episodes: the loss's advantages and the critic's targets
    are turn_gae of V_old over the rollout's turns (whitened over the trained tokens), one value per turn,
    0 on the tool's replies."""
    trainer = calculator_trainer(cache_dir, "updates=single", "kl.beta=0.05", "adv=gae", "adv.timestep=turn",
                                 "adv.gamma=0.9", "adv.lam=0.8")
    batch = trainer.sample(0, 1.0)
    anchors = trainer.anchor_logprobs(batch.roll, 1.0)
    shaped, adv, inputs, _ = trainer.rewards_and_advantages(batch, anchors, 0)
    turns, mask = batch.roll.turn_index, shaped.mask
    assert (batch.roll.turns > 1).any() and (batch.roll.sampled < batch.roll.completion_mask).any()
    raw, returns = turn_gae(token_rewards(adv.rewards, mask), anchors.old_values, mask, turns, 0.9, 0.8)
    n = mask.sum()
    mean = (raw * mask).sum() / n
    std = ((((raw - mean) * mask) ** 2).sum() / n + 1e-8).sqrt()
    torch.testing.assert_close(inputs.advantages, (raw - mean) / std * mask)
    torch.testing.assert_close(inputs.returns, returns)
    for row in range(len(mask)):
        for turn in turns[row][mask[row] > 0].unique():
            at = (turns[row] == turn) & (mask[row] > 0)
            assert inputs.advantages[row][at].unique().numel() == 1 and inputs.returns[row][at].unique().numel() == 1
    assert not inputs.advantages[mask == 0].any()


@pytest.mark.parametrize("timestep", ["turn", "token"])
def test_gae_on_episodes_is_the_same_in_micro_batches(timestep, cache_dir):
    """The advantages and the critic's targets are computed once on the whole batch (train/step.py
    rewards_and_advantages; every rank gets the whole batch's turn index), the value loss in the pieces:
    the same metrics and gradients unsplit and in uneven micro-batches."""
    from test_micro_batches import SPLITS, assert_split_invariant

    trainer = calculator_trainer(cache_dir, "updates=single", "kl.beta=0.05", "adv=gae", f"adv.timestep={timestep}",
                                 "adv.gamma=0.9", "adv.lam=0.8")
    whole = assert_split_invariant(trainer, {"3": SPLITS["3"], "budget": SPLITS["budget"]})
    assert whole["turns/mean"] > 1 and whole["turns/env_tokens_mean"] > 0 and "value/explained_variance" in whole
