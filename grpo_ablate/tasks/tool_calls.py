"""Tool-calling problems from data (task=tool_jsonl, tool_parquet, tool_hf): a JSONL file, a parquet
file or a Hugging Face dataset whose rows carry the tools the model may call, run as multi-turn
episodes through the model's chat template.

    {"question": "What is 47 * 59?", "answer": "2773", "tools": [<a tool spec>, ...]}

A tool spec is the JSON-schema function spec chat templates take (`apply_chat_template(tools=...)`,
OpenAI's shape): {"type": "function", "function": {"name", "description", "parameters": {"type":
"object", "properties": {...}, "required": [...]}}}. Its name must be a tool this task runs (TOOLS:
`calculator`, the calculator task's arithmetic) and its parameters must declare the arguments the
tool takes. A row whose spec is malformed is an error naming the row (at validate time, as every
malformed row of a data file: tasks/dataset.py), never dropped.

An episode, in messages (each rendered by the template; sampling/chat_replies.py for the tool's):

    user         What is 47 * 59?
    assistant    <tool_call>{"name": "calculator", "arguments": {"a": 47, "op": "*", "b": 59}}</tool_call>
    tool         {"result": 2773}
    assistant    47 * 59 = 2773

A call is written as Hermes' and Qwen2.5's templates ask (a JSON object between <tool_call> tags;
one call a turn: the first runs, as the calculator task's one call a turn, where Hermes allows
several); a turn with a call gets the tool's reply as a `tool` message and the episode goes on; a turn without
one is the answer and ends it, scored by math-verify against the row's answer (as task=jsonl scores).
A call that does not parse, names a tool the row does not give, or passes bad arguments gets
{"error": ...} (`parse_error`); a result the tool refuses, {"error": ...} (`tool_error`).

The prompt: the template renders the row's tools when it takes `tools=` (Qwen2.5, Llama 3.1);
SmolLM2's ignores them, and then they go into the system turn, with how to call them
(`tools_instruction`), before task.system_prompt.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from grpo_ablate.tasks.calculator import OPERATIONS, calculate
from grpo_ablate.tasks.dataset import HFDatasetTask, JsonlTask, MathProblem, ParquetTask
from grpo_ablate.tasks.environment import ANSWER, OK, PARSE_ERROR, TOOL_ERROR, Reply

CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# the tool's reply in a transcript: the last one ends the part before the final answer
_REPLY = re.compile(r'\{"(?:result": -?\d+|error": "[^"]*")\}')


def _calculator(arguments: dict) -> int | None:
    a, op, b = arguments.get("a"), arguments.get("op"), arguments.get("b")
    for name, value in (("a", a), ("b", b)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"argument {name!r} must be a non-negative integer")
    if op not in OPERATIONS:
        raise ValueError(f"argument 'op' must be one of {', '.join(sorted(OPERATIONS))}")
    return calculate(a, op, b)


# the tools this task runs: name -> (the arguments it takes, the function; None: it refuses the result)
TOOLS = {"calculator": (("a", "op", "b"), _calculator)}


def tools_instruction(tools: list[dict]) -> str:
    """The system turn's description of the tools, for a template that does not render `tools=`."""
    return ("You can call these tools:\n" + "\n".join(json.dumps(t, sort_keys=True) for t in tools) +
            '\nTo call one, reply with <tool_call>{"name": <tool name>, "arguments": <arguments>}</tool_call>; '
            "its result comes back as a tool message. When you know the answer, reply with the answer alone.")


def tool_spec_error(tools) -> str | None:
    """What is wrong with a row's tool specs, or None."""
    if not isinstance(tools, list) or not tools:
        return "not a non-empty list of tool specs"
    for number, spec in enumerate(tools, start=1):
        function = spec.get("function") if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or spec.get("type") != "function" or not isinstance(function, dict):
            return f"tool {number} is not {{\"type\": \"function\", \"function\": {{...}}}}"
        name, parameters = function.get("name"), function.get("parameters")
        if not isinstance(name, str) or not name:
            return f"tool {number} has no function.name"
        if name not in TOOLS:
            return f"tool {number} is {name!r}, not a tool this task runs ({', '.join(sorted(TOOLS))})"
        if not isinstance(parameters, dict) or parameters.get("type") != "object" \
                or not isinstance(parameters.get("properties"), dict):
            return f"tool {number} ({name}): function.parameters is not a JSON schema of type object with properties"
        required = parameters.get("required", [])
        if not isinstance(required, list) or any(r not in parameters["properties"] for r in required):
            return f"tool {number} ({name}): function.parameters.required names arguments it does not declare"
        missing = [a for a in TOOLS[name][0] if a not in parameters["properties"]]
        if missing:
            return f"tool {number} ({name}): function.parameters does not declare the argument {missing[0]!r}"
    return None


@dataclass(frozen=True)
class ToolProblem(MathProblem):
    tools_json: str = "[]"         # the row's tool specs (as JSON text: a problem stays hashable)

    @property
    def tools(self) -> list[dict]:
        return json.loads(self.tools_json)


def final_turn(transcript: str) -> str | None:
    """The policy's last turn in a transcript (the text after the last tool reply), None when it is a call."""
    replies = list(_REPLY.finditer(transcript))
    last = transcript[replies[-1].end():] if replies else transcript
    return None if "<tool_call>" in last else last


class ToolCallEnvironment:
    """One episode of a row: runs the calls to the row's tools, records the answer, owns the reward."""

    stop = ()   # a turn ends at the chat model's end-of-turn token; the text says whether it was a call

    def __init__(self, problem: ToolProblem, verifier):
        self.problem, self.verifier = problem, verifier
        self.tools = problem.tools
        self.answer: str | None = None

    def reset(self) -> None:
        self.answer = None

    def step(self, turn_text: str, turn: int) -> Reply:
        call = CALL.search(turn_text)
        if call is None:
            if "<tool_call>" in turn_text:   # an unclosed call is not an answer
                return self._error("the call is not closed with </tool_call>", PARSE_ERROR)
            self.answer = turn_text
            return Reply("", done=True, outcome=ANSWER)
        try:
            request = json.loads(call.group(1))
        except json.JSONDecodeError:
            return self._error("the call is not a JSON object", PARSE_ERROR)
        if not isinstance(request, dict) or not isinstance(request.get("arguments"), dict):
            return self._error('the call is not {"name": ..., "arguments": {...}}', PARSE_ERROR)
        name = request.get("name")
        if name not in {t["function"]["name"] for t in self.tools}:
            return self._error(f"no tool named {str(name)[:40]!r}", PARSE_ERROR)
        try:
            result = TOOLS[name][1](request["arguments"])
        except ValueError as err:
            return self._error(str(err), PARSE_ERROR)
        if result is None:
            return self._error("the result is too large", TOOL_ERROR)
        return Reply(json.dumps({"result": result}), outcome=OK, role="tool", reward=1.0)   # the call executed

    @staticmethod
    def _error(why: str, outcome: str) -> Reply:
        return Reply(json.dumps({"error": why.replace('"', "'")}), outcome=outcome, role="tool", reward=0.0)

    def reward(self) -> float:
        return 1.0 if self.answer is not None and self.verifier.correct(self.answer, self.problem.answer) else 0.0


class ToolRows:
    """The tool-calling part of a data task: its rows' tool specs, the episodes' budgets, the
    environment and how a transcript is scored; the row reader is the data task's (JSONL, parquet,
    a Hugging Face dataset). A row's tools may be a list of specs or that list as JSON text (as
    datasets such as xLAM store them); nested arrays a parquet file gives back are read as lists."""
    needs_chat_template = True   # the tool's replies are chat messages (sampling/prompts.py refuses a model without)

    def __init__(self, tools_field: str = "tools", max_turns: int = 3, turn_tokens: int = 64, **options):
        if not isinstance(tools_field, str) or not tools_field:
            raise ValueError(f"task.tools_field={tools_field!r} is not allowed; it must be a field name")
        for key, value in (("max_turns", max_turns), ("turn_tokens", turn_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"task.{key}={value!r} is not allowed; it must be an integer >= 1")
        if options.get("chat_template", "auto") != "auto":
            raise ValueError(f"task.chat_template must be auto with task={self.name}: the tool's replies are chat "
                             "messages the template renders")
        self.tools_field, self.max_turns, self.turn_tokens = tools_field, max_turns, turn_tokens
        super().__init__(**options)

    def _problem(self, where, row):
        problem, error = super()._problem(where, row)
        if error:
            return problem, error
        tools = row.get(self.tools_field)
        if isinstance(tools, str):   # the specs as JSON text
            try:
                tools = json.loads(tools)
            except json.JSONDecodeError:
                return None, f"'{self.tools_field}': text that is not JSON"
        tools = _plain_tree(tools)
        wrong = tool_spec_error(tools)
        if wrong:
            return None, f"'{self.tools_field}': {wrong}"
        fields = {k: getattr(problem, k) for k in MathProblem.__dataclass_fields__}
        return ToolProblem(**fields, tools_json=json.dumps(tools, sort_keys=True)), None

    def environment(self, problem: ToolProblem) -> ToolCallEnvironment:
        return ToolCallEnvironment(problem, self.verifier)

    def tools_instruction(self, tools: list[dict]) -> str:
        return tools_instruction(tools)

    def reward(self, completion: str, problem) -> float:
        """The environment's reward read off a transcript: its last turn, after the last tool reply."""
        last = final_turn(completion)
        return 1.0 if last is not None and self.verifier.correct(last, problem.answer) else 0.0

    def answer(self, completion: str):
        last = final_turn(completion)
        return None if last is None else super().answer(last)

    def formatted(self, completion: str) -> bool:
        last = final_turn(completion)
        return last is not None and super().formatted(last)


class ToolJsonlTask(ToolRows, JsonlTask):
    """task=tool_jsonl: task=jsonl's rows with a field of tool specs, as multi-turn tool-calling episodes."""
    name = "tool_jsonl"


class ToolParquetTask(ToolRows, ParquetTask):
    """task=tool_parquet: task=parquet's rows with a field of tool specs."""
    name = "tool_parquet"


class ToolHFTask(ToolRows, HFDatasetTask):
    """task=tool_hf: task=hf's rows (a hub dataset, or a local directory of data files) with a field of tool specs."""
    name = "tool_hf"


def _plain_tree(value):
    """A parquet/arrow value as JSON-ready Python: arrays as lists, numpy scalars as numbers, recursively;
    a missing nested value (None, NaN-free) stays None."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _plain_tree(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain_tree(v) for v in value]
    return value
