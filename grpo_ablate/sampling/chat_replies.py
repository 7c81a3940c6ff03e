"""An environment's reply as token ids: its text as it is, or a chat message rendered by the template.

A reply without a role (the calculator's "2773;") is its text, encoded once. A reply with a role
(`tool`) is a message of a conversation, and a chat model must see it as its chat template writes
it. It is rendered **once, as a suffix**, by the template itself: a probe conversation that ends
with an assistant turn, rendered, then the same with the reply message after it and the next
assistant header (add_generation_prompt); the second must extend the first, and what it adds is
the message (a prefix diff over a fixed probe conversation, as verl's multi-turn rollout takes a
tool message's ids: volcengine/verl a7661d0, verl/workers/rollout/schemas.py, BASE_CHAT_HISTORY;
here on the text, encoded once). Before it goes the part
of the template's close of an assistant turn that the policy did not write: SmolLM2's template closes
a turn with "<|im_end|>\\n", the policy's turn ended with its EOS "<|im_end|>", so the "\\n" is the
environment's. A turn that ended on a stop text rather than the template's close gets the whole
close.

That text is encoded once (the template's markers are the tokenizer's special tokens) and appended
as ids; the policy's own tokens are never decoded and re-encoded, so the trained ids are the sampled
ids. Where `apply_chat_template(tokenize=True)` of the whole conversation differs from the episode's
ids is only where the policy's tokens are not the canonical encoding of their text: what it sampled,
kept (ms-swift #10012, verl #6921 and TRL #6250 are the bugs of the other way).

A template that rewrites earlier turns when one is added (e.g. drops a reasoning block from past
assistant turns) renders no suffix: refused, in one line.
"""
from __future__ import annotations

# the probe's assistant turn: text no template rewrites, found again in its rendering
_PROBE_TURN = "PROBE-ASSISTANT-TURN-7f3a"
_PROBE = [{"role": "user", "content": "PROBE-USER-TURN"}, {"role": "assistant", "content": _PROBE_TURN}]


class ChatTemplateUnsupported(ValueError):
    """The tokenizer cannot render an environment's reply as a message (one line for the user)."""


class ReplyEncoder:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._opened: str | None = None     # the probe conversation rendered, up to its assistant turn's close
        self._close: str | None = None      # what the template writes after an assistant turn's content

    def __call__(self, text: str, role: str | None, last_policy_id: int) -> list[int]:
        """The reply's ids, after a policy turn whose last token is `last_policy_id`."""
        if role is None:
            return self.tokenizer(text, add_special_tokens=False).input_ids
        return self.tokenizer(self.chat_text(text, role, last_policy_id), add_special_tokens=False).input_ids

    def chat_text(self, text: str, role: str, last_policy_id: int) -> str:
        """The template's text between the policy's last token and the next assistant turn's first."""
        opened, close = self._probe()
        rendered = self._render(_PROBE + [{"role": role, "content": text}], generation_prompt=True)
        if not rendered.startswith(opened):
            raise ChatTemplateUnsupported(f"the chat template rewrites the earlier turns when a {role!r} message "
                                          "follows an assistant turn: its reply cannot be appended as a suffix")
        written = self.tokenizer.decode([last_policy_id], skip_special_tokens=False)
        rest = close[len(written):] if written and close.startswith(written) else close
        return rest + rendered[len(opened):]

    def _probe(self) -> tuple[str, str]:
        if self._opened is None:
            if not getattr(self.tokenizer, "chat_template", None):
                raise ChatTemplateUnsupported("the environment replies with chat messages and the tokenizer has no "
                                              "chat template to render them")
            opened = self._render(_PROBE, generation_prompt=False)
            if _PROBE_TURN not in opened:
                raise ChatTemplateUnsupported("the chat template does not render an assistant turn's content as it "
                                              "is: an environment's reply cannot be placed after it")
            self._opened, self._close = opened, opened[opened.rindex(_PROBE_TURN) + len(_PROBE_TURN):]
        return self._opened, self._close

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        except Exception as err:   # a template that refuses the role (e.g. raises on 'tool'): one line
            why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ChatTemplateUnsupported(f"the chat template cannot render a reply message: {why}") from None
