"""The turn_credit family: MT-GRPO's turn-level advantage by hand (float64) against its source's
`_assign_advantages` ("aae"), the turn rewards an episode records, the refusals, and a real step on
the calculator task split into micro-batches."""
from dataclasses import replace

import pytest
import torch

from grpo_ablate.sampling.decode import Rollout
from grpo_ablate.tasks import CalculatorTask
from grpo_ablate.train.rewards import TurnRewards
from grpo_ablate.tricks import option

D = torch.float64

# one group of four episodes (p: a policy token, e: the environment's reply, .: padding)
#   row 0  p p p e e p p   a call that executed (R^T = 1), the right answer (R^O = 1)
#   row 1  p p p e e p .   a call that executed (R^T = 1), a wrong answer   (R^O = 0)
#   row 2  p p . . . . .   answered without the tool (R^T = 0), right      (R^O = 1)
#   row 3  p p e p . . .   a call that did not parse (R^T = 0), wrong      (R^O = 0)
COMPLETION = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0, 0],
                           [1, 1, 1, 1, 0, 0, 0]], dtype=D)
SAMPLED = torch.tensor([[1, 1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 1, 0], [1, 1, 0, 0, 0, 0, 0],
                        [1, 1, 0, 1, 0, 0, 0]], dtype=D)
OUTCOME = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=D)
TURN = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=D)
GROUP = torch.zeros(4, dtype=torch.long)
EPS = 1e-6


def normalized(r):
    """The source's `_compute_normalized_advantages` (TRL's GRPO: Bessel-corrected std, eps outside)."""
    return (r - r.mean()) / (r.std() + EPS)


def rollout(completion=COMPLETION, sampled=SAMPLED, turn_reward=TURN):
    n, width = completion.shape
    return Rollout(torch.zeros((n, 2 + width), dtype=torch.long), torch.ones((n, 2 + width), dtype=torch.long), 2,
                   completion, torch.zeros(n, dtype=torch.bool), sampled=sampled, turn_reward=turn_reward)


def credit(name, **knobs):
    """The option's advantages [N, T] for the hand batch, through adv=grpo (eps 1e-6) as the chain's A(.)."""
    grpo = option("adv", "grpo").impl
    turns = TurnRewards.of(rollout(), "cpu")

    def advantage_of(a, b):
        return grpo(a * OUTCOME + b * turns.rewards, GROUP, COMPLETION, None, {}, eps=EPS)

    outcome = advantage_of(1.0, 0.0)
    out = option("turn_credit", name).impl(outcome, turns.rewards, turns.before_reply, turns.replied,
                                           advantage_of=advantage_of, **knobs)
    return (out if out.dim() == 2 else out[:, None]).expand_as(COMPLETION) * COMPLETION


def test_the_turn_rewards_split_at_the_first_environment_token():
    turns = TurnRewards.of(rollout(), "cpu")
    assert turns.replied.tolist() == [True, True, False, True]
    assert turns.before_reply.tolist() == [[1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0], [1] * 7,
                                           [1, 1, 0, 0, 0, 0, 0]]
    single = rollout()
    assert TurnRewards.of(replace(single, sampled=None, turn_reward=None), "cpu") is None   # no turn reward


@pytest.mark.parametrize("coef", [1.0, 0.5])
def test_mt_grpo_is_the_sources_additive_estimate_by_hand(coef):
    a_outcome, a_turn, a_merged = normalized(OUTCOME), normalized(TURN), normalized(OUTCOME + TURN)
    # by hand: R^O = (1, 0, 1, 0): mean 1/2, std sqrt(1/3); R^T = (1, 1, 0, 0) the same; R^O + R^T = (2, 1, 1, 0)
    s = 1 / 3 ** 0.5
    torch.testing.assert_close(a_outcome, torch.tensor([0.5, -0.5, 0.5, -0.5], dtype=D) / (s + EPS))
    torch.testing.assert_close(a_merged, torch.tensor([1.0, 0.0, 0.0, -1.0], dtype=D) / ((2 / 3) ** 0.5 + EPS))
    expected = torch.zeros_like(COMPLETION)
    for i, split in ((0, 3), (1, 3), (3, 2)):   # episodes with a reply: the turn term before it
        expected[i] = a_outcome[i] + coef * a_turn[i] * (torch.arange(7) < split).to(D)
    expected[2] = a_merged[2]                  # no reply: the merged reward's advantage on every token
    torch.testing.assert_close(credit("mt_grpo", coef=coef), expected * COMPLETION, rtol=0, atol=1e-12)
    # the tool-calling turn of the right answer gets A^O + c A^T, its answer turn A^O alone
    assert credit("mt_grpo", coef=coef)[0, 0] > credit("mt_grpo", coef=coef)[0, 5] > 0


@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_mt_grpo_cumulative_is_the_sources_cumulative_estimate_by_hand(gamma):
    a_outcome, a_cumulative = normalized(OUTCOME), normalized(TURN + gamma * OUTCOME)
    expected = torch.zeros_like(COMPLETION)
    for i, split in ((0, 3), (1, 3), (3, 2)):   # before the reply: the return's advantage; after: the outcome's
        before = (torch.arange(7) < split).to(D)
        expected[i] = a_cumulative[i] * before + a_outcome[i] * (1 - before)
    expected[2] = a_cumulative[2]             # no reply: the return's advantage on every token
    torch.testing.assert_close(credit("mt_grpo_cumulative", gamma=gamma), expected * COMPLETION, rtol=0, atol=1e-12)


def test_outcome_ignores_the_turn_rewards_and_merged_adds_them():
    torch.testing.assert_close(credit("outcome"), normalized(OUTCOME)[:, None] * COMPLETION, rtol=0, atol=1e-12)
    torch.testing.assert_close(credit("merged"), normalized(OUTCOME + TURN)[:, None] * COMPLETION, rtol=0, atol=1e-12)


def test_the_turn_term_is_the_gradient_on_the_calling_turn_alone():
    """The policy gradient of token_mean at ratio 1 is -A_t / n per trained token: MT-GRPO moves the
    calling turn's tokens by c A^T and leaves the answer's (and a reply-less episode's) as A(.) gives."""
    mask = COMPLETION * SAMPLED
    logp = torch.zeros_like(mask, requires_grad=True)
    for name in ("outcome", "mt_grpo"):
        loss = -(credit(name) * torch.exp(logp - logp.detach()) * mask).sum() / mask.sum()
        grad, = torch.autograd.grad(loss, logp)
        if name == "outcome":
            base = grad
    shift = (grad - base) * -mask.sum()
    turns = TurnRewards.of(rollout(), "cpu")
    expected = normalized(TURN)[:, None] * turns.before_reply * mask * turns.replied[:, None]
    expected[2] = (normalized(OUTCOME + TURN)[2] - normalized(OUTCOME)[2]) * mask[2]
    torch.testing.assert_close(shift, expected, rtol=0, atol=1e-12)


def test_an_episode_sums_its_turns_rewards():
    from test_multi_turn import episodes

    task = CalculatorTask(eval_size=4)
    problems = [task.make(47, "*", 59), task.make(3, "+", 4), task.make(12, "*", 3)]
    script = {"47*59=": "[47*59]", "3+4=": "7", "12*3=": "[12*]"}

    def turn(context):
        for prompt, first in script.items():
            if context == prompt:
                return first
        return "[12*3]" if context.endswith("?;") else "2773" if context.endswith("2773;") else "36"

    roll, _, rewards, _ = episodes(task, turn, problems, max_new_tokens=40)
    # a call that computed: 1; an answer: none; a call that did not parse (0), then one that computed (1)
    assert roll.turn_reward.tolist() == [1.0, 0.0, 1.0] and rewards.tolist() == [1.0, 1.0, 1.0]


def test_turn_credit_refuses_an_estimator_whose_baseline_is_the_outcomes():
    from grpo_ablate.config.compose import compose
    from grpo_ablate.config.validate import validate
    from grpo_ablate.errors import ConfigError

    for adv in ("gae", "remax"):
        with pytest.raises(ConfigError, match=f"turn_credit=mt_grpo needs .* adv={adv} is not one"):
            validate(compose(["task=calculator", "turn_credit=mt_grpo", f"adv={adv}"]))
    validate(compose(["task=calculator", "turn_credit=mt_grpo", "adv=rloo"]))


def test_turn_credit_is_inert_on_a_single_completion_task():
    from grpo_ablate.config.compose import compose

    for name in ("merged", "mt_grpo"):
        inert = option("turn_credit", name).inert[0].when
        assert inert(compose([f"turn_credit={name}"]))
        assert not inert(compose(["task=calculator", f"turn_credit={name}"]))


@pytest.mark.full
def test_turn_credit_changes_nothing_between_micro_batches(cache_dir):
    """One step on the calculator task under each turn_credit option that acts, unsplit and in uneven
    micro-batches: the same metrics and gradients (the advantages are computed once on the whole batch),
    and the turn rewards moved the advantages."""
    from conftest import SMALL
    from grpo_ablate.config.compose import compose
    from grpo_ablate.config.spec import run_spec
    from grpo_ablate.config.validate import validate
    from grpo_ablate.train.distributed import DataParallel
    from grpo_ablate.train.grpo import build_grpo
    from test_micro_batches import SPLITS, assert_split_invariant

    small = [o for o in SMALL if not o.startswith("task.")] + ["task=calculator", "task.eval_size=8",
                                                               "rollout.max_new_tokens=24",
                                                               "model.attn_implementation=sdpa"]
    for name in ("mt_grpo", "mt_grpo_cumulative", "merged"):
        cfg = compose(small + [f"model.cache_dir={cache_dir}", "updates=single", f"turn_credit={name}"])
        validate(cfg)
        trainer, _ = build_grpo(run_spec(cfg), torch.device("cpu"), DataParallel(), None, lambda *a, **k: None)
        for model in (trainer.p.policy, trainer.p.reference):
            model.double()
        whole = assert_split_invariant(trainer, {"3": SPLITS["3"]})
        assert whole["turns/turn_reward"] > 0 and whole["turn_credit/shift"] > 0
