"""Final answers of math completions, and checking them with math-verify.

A completion's final answer is, in order of preference:
    the last \\boxed{...} (nested braces allowed)        "... so \\boxed{\\frac{1}{2}}"
    the text after the last GSM8K marker "#### "        "... #### 0.5"
    the last number in the text                         "the answer is 1/2."
A gold answer field is read the same way, except that with neither marker the whole field is
the answer ("1/2", "\\frac{1}{2}", "72"), as in MATH's `answer` and GSM8K's `answer` columns.

Both sides are parsed by math-verify (Hugging Face's checker, used by open-r1 and TRL's
accuracy reward) inside \\boxed{}, so 1/2, 0.5, \\frac12 and \\dfrac{1}{2} are all equal, and
compared with `verify(gold, prediction)`.
"""
from __future__ import annotations

import re

_GSM8K = re.compile(r"####\s*([^\n]+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces matched; None if there is
    none or it is never closed. `\\boxed 5` (no braces) gives "5"."""
    matches = list(_BOXED.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    if start >= len(text):
        return None
    if text[start] != "{":
        token = re.match(r"[^\s$]+", text[start:])
        return token.group(0) if token else None
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i].strip()
    return None


def extract_answer(text: str) -> tuple[str | None, str | None]:
    """(answer, form) of a completion: form is "boxed", "gsm8k", "number" or None (no answer)."""
    boxed = last_boxed(text)
    if boxed:
        return boxed, "boxed"
    marked = _GSM8K.findall(text)
    if marked and marked[-1].strip():
        return marked[-1].strip(), "gsm8k"
    numbers = _NUMBER.findall(text)
    if numbers:
        return numbers[-1], "number"
    return None, None


def gold_answer(field: str) -> str:
    """The reference answer in a dataset's answer field (boxed, after ####, or all of it)."""
    answer, form = extract_answer(field)
    return answer if form in ("boxed", "gsm8k") else field.strip()


class MathVerifier:
    """math-verify's parse + verify; gold answers are parsed once and cached."""

    def __init__(self):
        try:
            from math_verify import parse, verify
        except ImportError:
            raise ValueError("math answers are checked with math-verify, which is not installed: "
                             "pip install 'grpo-ablate[hf]'") from None
        self._parse, self._verify = parse, verify
        self._gold: dict[str, list] = {}

    def parse(self, answer: str) -> list:
        """math-verify's parse of one answer (an empty list if it reads nothing)."""
        return self._parse("\\boxed{" + answer + "}") or self._parse(answer)

    def gold(self, answer: str) -> list:
        if answer not in self._gold:
            self._gold[answer] = self.parse(answer)
        return self._gold[answer]

    def correct(self, completion: str, gold: str) -> bool:
        answer, _ = extract_answer(completion)
        if answer is None:
            return False
        return bool(self._verify(self.gold(gold), self.parse(answer)))
