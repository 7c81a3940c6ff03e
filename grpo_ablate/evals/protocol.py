"""An eval protocol: how many samples per held-out problem, drawn how, and which summaries of them
are logged (the `eval` config group: conf/eval/greedy.yaml, sampled.yaml). The run spec carries
one (`RunSpec.eval`); `grpo-ablate eval` scores a finished run under another.

    eval/accuracy   avg@n: the mean correctness of the n samples of every problem (greedy: n = 1, T = 0)
    eval/pass@k     Chen et al.'s unbiased pass@k from the n samples (stats/pass_at_k.py)
    eval/maj@k      a majority vote over k of the n samples' parsed answers

Standard library only: the report reads protocols from the run dirs it reads (config.yaml, and
the header of a re-scored protocol's results) without importing the training stack.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

ACCURACY = "eval/accuracy"            # avg@n; for greedy, the accuracy of the one answer
PASS, MAJ = "pass", "maj"
_METRIC = re.compile(r"(?:eval/)?(accuracy|avg@\d+|pass@\d+|maj@\d+)")
FILTERS_OFF = {"top_p": 1.0, "top_k": 0, "min_p": 0.0}


@dataclass(frozen=True)
class EvalProtocol:
    """One protocol as its config group declares it (`pass_k` / `maj_k` None: their defaults, `resolved`)."""
    name: str = "greedy"
    samples: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    pass_k: tuple[int, ...] | None = ()
    maj_k: tuple[int, ...] | None = ()

    @classmethod
    def from_group(cls, group) -> "EvalProtocol":
        """From the `eval` group's values (a mapping with at least these keys; others ignored)."""
        read = {f.name: group.get(f.name, f.default) for f in fields(cls)}
        for key in ("pass_k", "maj_k"):
            read[key] = None if read[key] is None else tuple(int(k) for k in read[key])
        return cls(**{**read, "name": str(read["name"]), "samples": int(read["samples"]),
                      "temperature": float(read["temperature"]), "top_p": float(read["top_p"]),
                      "top_k": int(read["top_k"]), "min_p": float(read["min_p"])})

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def resolved(self, parses_answers: bool) -> "EvalProtocol":
        """The defaults filled in: pass_k null -> 2, 4, 8, ... up to samples (and samples itself);
        maj_k null -> samples when the task parses answers and samples > 1."""
        pass_k = self.pass_k
        if pass_k is None:
            pass_k = tuple(sorted({*(2 ** i for i in range(1, self.samples.bit_length()) if 2 ** i <= self.samples),
                                   *((self.samples,) if self.samples > 1 else ())}))
        maj_k = self.maj_k
        if maj_k is None:
            maj_k = (self.samples,) if parses_answers and self.samples > 1 else ()
        return EvalProtocol(self.name, self.samples, self.temperature, self.top_p, self.top_k, self.min_p,
                            tuple(pass_k), tuple(maj_k))

    def settings(self) -> dict:
        """What identifies the protocol's numbers (results made under other settings are not these)."""
        out = asdict(self)
        out.pop("name")
        for key in ("pass_k", "maj_k"):
            out[key] = None if out[key] is None else list(out[key])
        return out

    @property
    def accuracy_label(self) -> str:
        """What eval/accuracy is under this protocol, in a word: `accuracy` (greedy) or `avg@8`."""
        return "accuracy" if self.greedy else f"avg@{self.samples}"

    def metrics(self) -> list[str]:
        """The metrics.jsonl columns one eval under this (resolved) protocol logs."""
        return [ACCURACY, *(f"eval/pass@{k}" for k in self.pass_k or ()), *(f"eval/maj@{k}" for k in self.maj_k or ())]

    def describe(self) -> str:
        """'greedy' or '8 samples at T=1 (top-p 0.95)': how a report names it."""
        if self.greedy:
            return "greedy (one answer per problem)"
        filters = [f"{name.replace('_', '-')} {getattr(self, name):g}" for name, off in FILTERS_OFF.items()
                   if getattr(self, name) != off]
        return (f"{self.samples} sample{'s' * (self.samples != 1)} per problem at T={self.temperature:g}"
                + (f" ({', '.join(filters)})" if filters else ""))


GREEDY = EvalProtocol()


def parse_metric(name: str) -> tuple[str, int | None] | None:
    """An eval metric's kind and k: `eval/accuracy` and `avg@n` -> ("avg", None), `eval/pass@8` or
    `pass@8` -> ("pass", 8), `maj@8` -> ("maj", 8); None for anything else."""
    match = _METRIC.fullmatch(name.strip())
    if match is None:
        return None
    text = match.group(1)
    if text == "accuracy" or text.startswith("avg@"):
        return "avg", None
    kind, _, k = text.partition("@")
    return kind, int(k)


def metric_column(name: str) -> str:
    """The metrics.jsonl column of an eval metric as a user may write it (`pass@8`, `avg@8`,
    `eval/maj@4`): avg@n is eval/accuracy; anything else is returned as given."""
    parsed = parse_metric(name)
    if parsed is None:
        return name
    kind, k = parsed
    return ACCURACY if kind == "avg" else f"eval/{kind}@{k}"
