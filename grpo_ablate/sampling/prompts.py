"""A problem's prompt as token ids: the tokenizer's chat template, a system prompt, a length limit.

Set in the task group (the task owns how its problems are presented):
    task.chat_template: auto | none   auto: the tokenizer's chat template when it has one (the
                                      question is the user turn, then the assistant's turn begins)
    task.system_prompt: text | null   a system turn; without a chat template, the text and a
                                      blank line go before the prompt
    task.max_prompt_tokens: n | null  problems whose prompt is longer are dropped when the run
                                      starts (verl's filter_overlong_prompts), counted once

A problem with `tools` (task=tool_jsonl) passes them to the template (`apply_chat_template(tools=)`);
a template that renders nothing of them (SmolLM2's) gets them in the system turn instead, as the
task describes them (`task.tools_instruction(tools)`), before task.system_prompt.

The embedded arithmetic task has none of these keys: its prompts are raw text ("47+59=").
Prompts are left-padded for generation by the sampler (rollout.left_pad).
"""
from __future__ import annotations

from grpo_ablate.errors import ConfigError
from grpo_ablate.sampling.chat_replies import ChatTemplateUnsupported, ReplyEncoder


class PromptEncoder:
    def __init__(self, tokenizer, task):
        self.tokenizer = tokenizer
        self.system_prompt = getattr(task, "system_prompt", None)
        self.max_tokens = getattr(task, "max_prompt_tokens", None)
        wanted = getattr(task, "chat_template", "none")
        self.chat = wanted == "auto" and bool(getattr(tokenizer, "chat_template", None))
        self.tools_instruction = getattr(task, "tools_instruction", None)
        if getattr(task, "needs_chat_template", False):   # checked before a step, not at the first tool reply
            name = getattr(task, "name", type(task).__name__)
            if not self.chat:
                raise ConfigError(f"task={name} needs a tokenizer with a chat template (its tool replies are chat "
                                  "messages), and this model's has none")
            try:
                ReplyEncoder(tokenizer).chat_text("", "tool", tokenizer.eos_token_id)
            except ChatTemplateUnsupported as err:
                raise ConfigError(f"task={name}: {err}") from None

    def text(self, prompt: str, tools: list[dict] | None = None) -> str:
        """The prompt as the model sees it (before tokenization)."""
        if not self.chat:
            return f"{self.system_prompt}\n\n{prompt}" if self.system_prompt else prompt
        messages = self._messages(prompt, self.system_prompt)
        if tools:
            with_tools = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                            tokenize=False)
            if with_tools != self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False):
                return with_tools
            # the template renders nothing of the tools: they go into the system turn, as the task describes them
            described = self.tools_instruction(tools)
            messages = self._messages(prompt, described + (f"\n\n{self.system_prompt}" if self.system_prompt else ""))
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    @staticmethod
    def _messages(prompt: str, system: str | None) -> list[dict]:
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]

    def __call__(self, problem) -> list[int]:
        # A chat template writes its own special tokens (BOS included): add none twice.
        text = self.text(problem.prompt, getattr(problem, "tools", None))
        return self.tokenizer(text, add_special_tokens=not self.chat).input_ids

    def drop_long_prompts(self, task, say) -> dict:
        """task.max_prompt_tokens: remove longer problems from the task once, say so, and return
        the counts as metrics for the first row of metrics.jsonl ({} without a limit)."""
        if not self.max_tokens:
            return {}
        dropped_train, dropped_eval = task.drop_prompts(lambda p: len(self(p)) > self.max_tokens)
        if dropped_train or dropped_eval:
            say(f"prompts: dropped {dropped_train} training and {dropped_eval} eval problems longer than "
                f"task.max_prompt_tokens={self.max_tokens} (kept {len(task.train)} and {len(task.eval)})")
        return {"prompts/dropped": dropped_train, "prompts/dropped_eval": dropped_eval}
