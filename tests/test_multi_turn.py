"""Multi-turn episodes: the env_mask formula by hand (float64), the calculator's turns and outcomes
through a scripted engine, exact token-in/token-out on the HF engine, split-invariance with
environment tokens present."""
import random

import pytest
import torch

from grpo_ablate.models import build_char_tokenizer, build_tiny_model
from grpo_ablate.sampling.decode import Rollout, concat_rollouts, left_pad, select_rows
from grpo_ablate.sampling.engines import HFEngine
from grpo_ablate.sampling.multi_turn import run_episodes
from grpo_ablate.tasks import CalculatorTask
from grpo_ablate.tasks.environment import Reply
from grpo_ablate.train.forward import completion_logprobs
from grpo_ablate.tricks import option, options
from grpo_ablate.tricks.loss_agg import aggregate

D = torch.float64
TOKENIZER = build_char_tokenizer(CalculatorTask.chars)
EOS, PAD = TOKENIZER.eos_token_id, TOKENIZER.pad_token_id


def ids(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False).input_ids


# ---------------------------------------------------------------------------------------- env_mask
# two rows: row 0 a multi-turn episode "[3*4]" "12;" "12"<eos> cut to 6 tokens here for the hand
# vector: policy, policy, env, env, policy, (padding); row 1 a single policy turn of 3 tokens
COMPLETION = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]], dtype=D)
SAMPLED = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0]], dtype=D)
ADVANTAGE = torch.tensor([[1.0], [-0.5]], dtype=D)


def policy_loss(mask, loss_agg="token_mean"):
    """(loss, d loss / d log pi) of the on-policy surrogate -A r_t, r_t = exp(logp - logp.detach()),
    aggregated by a loss_agg option's weights over `mask`."""
    logp = torch.tensor([[-0.3, -1.2, -2.0, -0.7, -0.1, -5.0], [-0.9, -0.4, -1.5, -5.0, -5.0, -5.0]], dtype=D,
                        requires_grad=True)
    ratio = torch.exp(logp - logp.detach())
    weights = option("loss_agg", loss_agg).impl(mask, 6, torch.tensor([0, 0]))
    loss = aggregate(-ADVANTAGE * ratio, weights)
    loss.backward()
    return loss.item(), logp.grad


def test_masking_env_tokens_trains_only_what_the_policy_sampled():
    masked = option("env_mask", "masked").impl(COMPLETION, SAMPLED)
    unmasked = option("env_mask", "unmasked").impl(COMPLETION, SAMPLED)
    assert torch.equal(masked, COMPLETION * SAMPLED) and torch.equal(unmasked, COMPLETION)
    # token_mean, by hand: L = -sum_t m_t A r_t / sum_t m_t, dL/dlogp_t = -m_t A / sum_t m_t at r = 1
    loss, grad = policy_loss(masked)
    assert loss == pytest.approx(-(3 * 1.0 + 3 * -0.5) / 6, abs=1e-15)            # 6 sampled tokens
    expected = torch.tensor([[-1, -1, 0, 0, -1, 0], [0.5, 0.5, 0.5, 0, 0, 0]], dtype=D) / 6
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)
    loss, grad = policy_loss(unmasked)
    assert loss == pytest.approx(-(5 * 1.0 + 3 * -0.5) / 8, abs=1e-15)            # the 2 reply tokens count
    expected = torch.tensor([[-1, -1, -1, -1, -1, 0], [0.5, 0.5, 0.5, 0, 0, 0]], dtype=D) / 8
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("loss_agg", sorted(options("loss_agg")))
def test_every_loss_agg_gives_env_tokens_no_gradient_when_masked(loss_agg):
    _, grad = policy_loss(option("env_mask", "masked").impl(COMPLETION, SAMPLED), loss_agg)
    assert torch.all(grad[SAMPLED == 0] == 0) and torch.all(grad[(SAMPLED == 1) & (COMPLETION == 1)] != 0)


def test_on_a_single_turn_rollout_both_options_are_the_completion_mask():
    for name in ("masked", "unmasked"):
        assert torch.equal(option("env_mask", name).impl(COMPLETION, None), COMPLETION)


# ---------------------------------------------------------------------------------- a scripted engine
class ScriptedEngine:
    """An engine whose turns are scripted: `script(context text) -> the turn's text` (then EOS unless
    the text ends in a stop), cut at the turn's budget and its first stop id, as `generate` does."""

    def __init__(self, script):
        self.script, self.calls = script, []

    def generate(self, prompts, *, num_samples, max_new_tokens, temperature, eos_id, pad_id, generator=None,
                 noise=None, filters=None):
        turns = []
        for prompt in prompts:
            text = self.script(TOKENIZER.decode(prompt))
            turn = ids(text) + ([] if text.endswith("]") else [EOS])
            cut = next((i + 1 for i, t in enumerate(turn) if t in eos_id), len(turn))
            turns.append(turn[:min(cut, max_new_tokens)])
        self.calls.append(turns)
        prompt_ids, prompt_mask = left_pad(prompts, pad_id)
        width = max(len(t) for t in turns)
        completion = torch.full((len(turns), width), pad_id)
        mask = torch.zeros((len(turns), width))
        for i, t in enumerate(turns):
            completion[i, :len(t)], mask[i, :len(t)] = torch.tensor(t), 1
        return Rollout(torch.cat([prompt_ids, completion], 1), torch.cat([prompt_mask, mask.long()], 1),
                       prompt_ids.shape[1], mask, torch.tensor([t[-1] not in eos_id for t in turns]),
                       sampler_logprobs=-mask)


def episodes(task, script, problems, max_new_tokens=32):
    engine = ScriptedEngine(script)
    roll, texts, rewards = run_episodes(engine, TOKENIZER, task, problems, [ids(p.prompt) for p in problems],
                                        num_samples=1, max_new_tokens=max_new_tokens, temperature=1.0, eos_id=EOS,
                                        pad_id=PAD)
    return roll, texts, rewards, engine


def test_a_tool_call_its_reply_and_the_answer_are_one_trajectory():
    task = CalculatorTask(eval_size=4)
    problem = task.make(47, "*", 59)
    roll, texts, rewards, _ = episodes(task, lambda context: "[47*59]" if context.endswith("=") else "2773",
                                       [problem])
    assert texts == ["[47*59]2773;2773"] and rewards.tolist() == [1.0]
    assert task.reward(texts[0], problem) == 1.0                  # the task's reward agrees with the environment's
    n = int(roll.completion_mask.sum())
    assert roll.completion_ids[0, :n].tolist() == ids("[47*59]") + ids("2773;") + ids("2773") + [EOS]
    assert roll.sampled[0, :n].tolist() == [1.0] * 7 + [0.0] * 5 + [1.0] * 5
    assert roll.turn_index[0, :n].tolist() == [0] * 12 + [1] * 5
    assert roll.sampler_logprobs[0, :n].tolist() == [-1.0] * 7 + [0.0] * 5 + [-1.0] * 5   # none for the reply
    assert roll.turns.tolist() == [2] and roll.failed_turns.tolist() == [0] and roll.truncated.tolist() == [False]


def test_bad_turns_are_recorded_outcomes_never_a_crash():
    task = CalculatorTask(eval_size=4, max_turns=3, turn_tokens=8)
    problems = [task.make(3, "+", 4), task.make(5, "*", 6), task.make(7, "+", 8)]

    def script(context):
        if context.startswith("3+4="):
            return "[3+]" if context.endswith("=") else "7"         # a call that does not parse, then an answer
        if context.startswith("5*6="):
            return "[5*6*6*6*6*6]"                                  # over the per-turn budget
        return "[7+8]"                                              # calls until the turn budget runs out
    roll, texts, rewards, _ = episodes(task, script, problems)
    assert texts[0] == "[3+]?;7" and rewards[0] == 1.0
    assert roll.turns.tolist() == [2, 1, 3] and roll.failed_turns.tolist() == [1, 1, 0]
    assert roll.truncated.tolist() == [False, True, False]        # a turn cut by its budget ends its episode
    assert texts[1] == "[5*6*6*6" and texts[2] == "[7+8]15;" * 3 and rewards.tolist() == [1.0, 0.0, 0.0]


class RaisingEnvironment:
    stop, tools = ("]",), []

    def reset(self):
        pass

    def step(self, turn_text, turn):
        raise RuntimeError("the tool crashed")

    def reward(self):
        raise RuntimeError("the reward crashed too")


class RaisingTask(CalculatorTask):
    def environment(self, problem):
        return RaisingEnvironment()


def test_a_tool_that_raises_ends_its_episode_as_a_recorded_tool_error():
    task = RaisingTask(eval_size=4)
    roll, texts, rewards, _ = episodes(task, lambda context: "[1+1]", [task.make(1, "+", 1)])
    assert texts == ["[1+1]"] and rewards.tolist() == [0.0]
    assert roll.turns.tolist() == [1] and roll.failed_turns.tolist() == [1]


def test_a_reply_past_the_trajectory_budget_ends_the_episode_truncated():
    task = CalculatorTask(eval_size=4)
    roll, texts, _, _ = episodes(task, lambda context: "[99*99]", [task.make(99, "*", 99)], max_new_tokens=9)
    assert texts == ["[99*99]98"] and roll.truncated.tolist() == [True] and roll.completion_mask.shape[1] == 9


def test_episodes_concatenate_with_single_turn_rollouts_field_by_field():
    task = CalculatorTask(eval_size=4)
    roll, *_ = episodes(task, lambda context: "[2+2]" if context.endswith("=") else "4",
                        [task.make(2, "+", 2), task.make(9, "*", 9)])
    both = concat_rollouts([roll, select_rows(roll, torch.tensor([1]))], PAD)
    assert torch.equal(both.sampled[2], both.sampled[1]) and both.turns.tolist() == [2, 2, 2]
    assert torch.equal(both.sampled_mask, both.completion_mask * both.sampled)


# --------------------------------------------------------------------------- the HF engine, exactly
class SampledIdsRecorder(HFEngine):
    """The HF engine, recording the ids each turn's call sampled."""

    def __init__(self, policy):
        super().__init__(policy, lean=True)
        self.turns = []

    def generate(self, prompts, **kwargs):
        roll = super().generate(prompts, **kwargs)
        self.turns.append([roll.completion_ids[i, :int(n)].tolist() for i, n in enumerate(roll.lengths)])
        return roll


class EveryDigitEnvironment:
    """Replies "?;" to every turn, and a turn stops at any digit: an untrained model's episodes have
    several turns with environment tokens between them."""
    stop, tools = tuple("0123456789"), []

    def reset(self):
        pass

    def step(self, turn_text, turn):
        return Reply("?;")

    def reward(self):
        return 0.0


class EveryDigitTask(CalculatorTask):
    def environment(self, problem):
        return EveryDigitEnvironment()


def untrained_episodes():
    """An untrained tiny model and a task whose every digit ends a turn: episodes of several turns."""
    model = build_tiny_model({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                              "num_attention_heads": 2, "num_key_value_heads": 1,
                              "max_position_embeddings": 128}, TOKENIZER, seed=0)
    return model, EveryDigitTask(eval_size=4, max_turns=4, turn_tokens=6)


def test_the_trained_ids_are_the_sampled_ids_token_for_token_on_the_hf_engine():
    model, task = untrained_episodes()
    problems = task.train_batch(3, 0, 0)
    engine = SampledIdsRecorder(model)
    roll, texts, _ = run_episodes(engine, TOKENIZER, task, problems, [ids(p.prompt) for p in problems],
                                  num_samples=2, max_new_tokens=30, temperature=1.0, eos_id=EOS, pad_id=PAD,
                                  generator=torch.Generator().manual_seed(0))
    assert int((roll.completion_mask * (1 - roll.sampled)).sum()) > 0        # environment tokens are present
    # each row's policy tokens, turn by turn, are what the engine sampled, in order
    running = list(range(6))
    for turn, sampled in enumerate(engine.turns):
        for row, turn_ids in zip(running, sampled):
            at = (roll.turn_index[row] == turn) & (roll.sampled[row] == 1)
            assert roll.completion_ids[row][at].tolist() == turn_ids[:int(at.sum())]
        running = [r for r in running if int(roll.turns[r]) > turn + 1]
    # ... the environment's tokens are its replies' ids, and scoring the trained ids reproduces the
    # sampler's log-probs on every sampled token (the same ids at the same positions)
    env = (roll.completion_mask == 1) & (roll.sampled == 0)
    assert set(roll.completion_ids[env].tolist()) <= set(ids("?;"))
    logp, _ = completion_logprobs(model, roll)
    policy = roll.sampled_mask.bool()
    torch.testing.assert_close(logp[policy], roll.sampler_logprobs[policy], rtol=0, atol=1e-5)
    assert all(TOKENIZER.decode(roll.completion_ids[i][roll.completion_mask[i] == 1].tolist(),
                                skip_special_tokens=True) == texts[i] for i in range(6))


# -------------------------------------------------------------------------- a real step, split
def test_env_tokens_change_nothing_between_micro_batches(cache_dir):
    """One step on the calculator task (episodes with tool replies), unsplit and in uneven micro-batches:
    the same metrics and gradients, under both env_mask options, with the truncated episodes
    (their replies too) masked out by overlong=filter, and with each policy turn weighed alike
    (loss_agg=turn_mean: its normaliser counts the turns of the whole step)."""
    from conftest import SMALL
    from grpo_ablate.config.compose import compose
    from grpo_ablate.config.spec import run_spec
    from grpo_ablate.config.validate import validate
    from grpo_ablate.train.distributed import DataParallel
    from grpo_ablate.train.grpo import build_grpo
    from test_micro_batches import SPLITS, assert_split_invariant

    # sdpa: in float64 the eager attention of transformers gives NaN on every left-padded row (its mask's
    # minimum overflows), and the calculator's prompts differ in length (the arithmetic tests' do not)
    small = [o for o in SMALL if not o.startswith("task.")] + ["task=calculator", "task.eval_size=8",
                                                               "rollout.max_new_tokens=24",
                                                               "model.attn_implementation=sdpa"]
    # overlong=filter: a 6-token turn budget cuts the calls of two 2-digit operands ("[47*59]" is 7 tokens)
    for env_mask, extra in (("masked", []), ("unmasked", []), ("masked", ["overlong=filter", "task.turn_tokens=6"]),
                            ("masked", ["loss_agg=turn_mean", "updates.mini_batches=2"])):
        cfg = compose(small + [f"model.cache_dir={cache_dir}", "updates=single", "kl.beta=0.05",
                               f"env_mask={env_mask}", *extra])
        validate(cfg)
        trainer, _ = build_grpo(run_spec(cfg), torch.device("cpu"), DataParallel(), None, lambda *a, **k: None)
        for model in (trainer.p.policy, trainer.p.reference):
            model.double()
        whole = assert_split_invariant(trainer, {"3": SPLITS["3"], "budget": SPLITS["budget"]})
        assert whole["turns/env_tokens_mean"] > 0
        assert (whole["env_mask/env_token_frac"] > 0) == (env_mask == "unmasked")
        # filter: some episodes cut and masked out, some trained
        filtered = "overlong=filter" in extra
        assert (0 < whole["overlong/masked_frac"] < 1) if filtered else whole["overlong/masked_frac"] == 0
        assert whole["turns/mean"] > 1            # episodes of two turns: turn_mean weighs them apart


def test_the_warm_start_imitates_the_policy_turns_not_the_tool_reply():
    from grpo_ablate.models import supervised_batch

    task = CalculatorTask(eval_size=4)
    problem = task.make(12, "*", 3)
    segments = task.demonstration_turns(problem, random.Random(0))
    assert segments == [("[12*3]", True), ("36;", False), ("36", True)]
    ids_, _, labels = supervised_batch(TOKENIZER, [problem.prompt], [segments])
    target = ids_[0, len(ids("12*3=")):]
    assert target.tolist() == ids("[12*3]36;36") + [EOS]
    assert labels[0, len(ids("12*3=")):].tolist() == ids("[12*3]") + [-100] * 3 + ids("36") + [EOS]
    slipped = task.demonstration_turns(problem, random.Random(0), slip_prob=1.0)
    assert slipped == [("37", True)]                               # a product answered without the tool, off by one


def test_score_centering_on_the_environments_tokens_is_refused_in_one_line():
    from grpo_ablate.config.compose import compose
    from grpo_ablate.config.validate import validate
    from grpo_ablate.errors import ConfigError

    with pytest.raises(ConfigError, match="score_centering=top_k cannot take env_mask=unmasked on a multi-turn"):
        validate(compose(["task=calculator", "score_centering=top_k", "env_mask=unmasked"]))
    for accepted in (["score_centering=top_k"], ["rollout.top_p=0.9", "rollout.top_k=8"], ["rollout=vllm"]):
        validate(compose(["task=calculator", *accepted]))   # its episodes run on vLLM too (tests/test_vllm_cpu.py)


def test_each_turn_keeps_its_kept_sets_and_head_at_its_own_tokens():
    """A filtering sampler's kept sets and the sampler's top-k head, recorded turn by turn, sit at each turn's
    tokens (none at the environment's): replaying the kept sets scores exactly the sampler's renormalised
    log-probs, and the head's log-probs are the trainer's at the head ids."""
    from grpo_ablate.sampling.filters import NOT_KEPT, SamplingFilters

    model, task = untrained_episodes()
    problems = task.train_batch(3, 0, 0)
    for filters, head in ((SamplingFilters(top_k=6, top_p=0.9), 0), (None, 4)):
        roll, _, _ = run_episodes(HFEngine(model, lean=True), TOKENIZER, task, problems,
                                  [ids(p.prompt) for p in problems], num_samples=2, max_new_tokens=30,
                                  temperature=1.0, eos_id=EOS, pad_id=PAD,
                                  generator=torch.Generator().manual_seed(0), filters=filters, head=head)
        policy, env = roll.sampled_mask.bool(), (roll.completion_mask == 1) & (roll.sampled == 0)
        assert env.any() and int(roll.turns.max()) > 1
        if filters is not None:
            kept = roll.kept_ids
            assert (kept[env] == NOT_KEPT).all() and (kept[policy] != NOT_KEPT).any(dim=-1).all()
            assert ((kept[policy] == roll.completion_ids[policy][:, None]).any(dim=-1)).all()
            assert roll.head_ids is None
            logp, _ = completion_logprobs(model, roll, score_kept_sets=True)
            torch.testing.assert_close(logp[policy], roll.sampler_logprobs[policy], rtol=0, atol=1e-5)
        else:
            assert roll.kept_ids is None and roll.head_ids.shape[-1] == 4
            assert torch.isinf(roll.head_logprobs[env]).all()
            *_, head_logp = completion_logprobs(model, roll, return_head=True)
            torch.testing.assert_close(head_logp[policy], roll.head_logprobs[policy], rtol=0, atol=1e-5)


def test_a_failed_last_turn_stays_counted_when_the_turn_budget_ends_the_episode():
    task = CalculatorTask(eval_size=4, max_turns=2)
    roll, texts, _, _ = episodes(task, lambda context: "[1+]", [task.make(1, "+", 1)])
    assert texts == ["[1+]?;[1+]?;"] and roll.turns.tolist() == [2] and roll.failed_turns.tolist() == [2]


def test_unmasking_is_inert_on_a_single_completion_task_and_acts_on_a_multi_turn_one():
    from grpo_ablate.config.compose import compose

    inert = option("env_mask", "unmasked").inert[0].when
    assert inert(compose([])) and not inert(compose(["task=calculator"]))


class ChatStyleEnvironment:
    """Every turn ends with EOS (a chat model's end of turn); the environment says when it is over."""
    stop, tools = (), []

    def reset(self):
        self.turns = 0

    def step(self, turn_text, turn):
        self.turns += 1
        return Reply("", done=True, outcome="answer") if turn_text == "7" else Reply("?;")

    def reward(self):
        return 1.0


class ChatStyleTask(CalculatorTask):
    def environment(self, problem):
        return ChatStyleEnvironment()


def test_the_environment_decides_whether_an_eos_turn_ends_the_episode():
    task = ChatStyleTask(eval_size=4)
    roll, texts, _, _ = episodes(task, lambda context: "7" if context.endswith("?;") else "3",
                                 [task.make(3, "+", 4)])
    n = int(roll.completion_mask.sum())
    assert roll.completion_ids[0, :n].tolist() == ids("3") + [EOS] + ids("?;") + ids("7") + [EOS]
    assert roll.sampled[0, :n].tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0] and roll.turns.tolist() == [2]


def test_per_row_draws_give_each_episode_whatever_the_rows_split():
    """rollout.rng=per_row: an episode's turns are drawn from its row's own uniforms (its global index),
    so the six episodes sampled in one call are those sampled in two calls of three (two ranks)."""
    from grpo_ablate.sampling.decode import RowNoise

    model, task = untrained_episodes()
    problems = task.train_batch(3, 0, 0)

    def sample(part, first):
        roll, texts, _ = run_episodes(HFEngine(model, lean=True), TOKENIZER, task, problems[part],
                                      [ids(p.prompt) for p in problems[part]], num_samples=2, max_new_tokens=10,
                                      temperature=1.0, eos_id=EOS, pad_id=PAD, noise=RowNoise(7, first, 6))
        return roll, texts

    whole, texts = sample(slice(0, 3), 0)
    (head, head_texts), (tail, tail_texts) = sample(slice(0, 1), 0), sample(slice(1, 3), 2)
    assert head_texts + tail_texts == texts and len(set(texts)) > 1
    # the trajectory budget ends episodes at different turns: later turns sample a non-contiguous set of rows
    assert int(whole.turns.max()) > 1 and (whole.turns != whole.turns[0]).any()
    for part, rows in ((head, range(0, 2)), (tail, range(2, 6))):
        for k, row in enumerate(rows):
            n = int(whole.completion_mask[row].sum())
            assert part.completion_ids[k, :n].tolist() == whole.completion_ids[row, :n].tolist()
            assert part.sampled[k, :n].tolist() == whole.sampled[row, :n].tolist()
