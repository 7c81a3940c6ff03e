"""The prompt pool of the `prompt_pool` family: a finite set of prompts, what the run observed of
each, and the draws of every step (tricks/prompt_pool.py has the rules and their references).

The pool is `task.prompt_pool(size, seed)`. Each prompt's latest pass rate (the mean verifier
score of its last sampled group; NaN until sampled) and whether it is retired are kept here.
Options with epochs (`epochs`, `no_positive_resampling`) consume a permutation of the pool epoch
after epoch; the option makes each epoch's permutation (and retires prompts) when the previous
one runs out, from a generator seeded by (seed, epoch). `difficulty` draws each round's prompts
afresh from a generator seeded by (seed, step, round). The observations, the retired set and the
epoch position are checkpointed (`state_dict`), so a resumed run draws what the uninterrupted
one draws.
"""
from __future__ import annotations

import math

import torch

from grpo_ablate.sampling.decode import derived_seed
from grpo_ablate.config.spec import RunSpec
from grpo_ablate.train.state import Plugin, stateful


class PromptPool(Plugin):
    """The prompt_pool family's plugin: the step's prompts come from the pool (`prompts`)."""
    key = "prompt_pool"

    def __init__(self, problems: list, choose, epochs: bool, borders: tuple, seed: int):
        self.seed = seed
        self.problems = problems
        self.choose = choose                            # the option: (pass_rate, retired, n, generator) -> ...
        self.epochs = epochs                            # the option consumes the pool epoch after epoch
        self.borders = borders                          # (easy_border, hard_border): pool/easy, pool/hard
        n = len(self.problems)
        self.pass_rate = torch.full((n,), math.nan, dtype=torch.float64)
        self.retired = torch.zeros(n, dtype=torch.bool)
        self.order = torch.zeros(0, dtype=torch.long)   # this epoch's remaining prompts
        self.epoch = 0

    def prompts(self, source):
        return self

    def draw(self, n: int, step: int, sampling_round: int) -> tuple[list, torch.Tensor]:
        """The problems of one sampling round and their pool indices."""
        if self.epochs:
            parts = []
            while n > 0:
                if len(self.order) == 0:
                    self.epoch += 1
                    generator = torch.Generator().manual_seed(derived_seed(self.seed, ("pool-epoch", self.epoch)))
                    self.order, self.retired = self.choose(self.pass_rate, self.retired, len(self.problems),
                                                           generator)
                parts.append(self.order[:n])
                self.order, n = self.order[n:], n - len(parts[-1])
            indices = torch.cat(parts)
        else:
            generator = torch.Generator().manual_seed(derived_seed(self.seed, ("pool", step, sampling_round)))
            indices, self.retired = self.choose(self.pass_rate, self.retired, n, generator)
        return [self.problems[i] for i in indices.tolist()], indices

    def observe(self, indices: torch.Tensor, scores: torch.Tensor) -> None:
        """Each drawn prompt's pass rate: the mean verifier score of its group (scores [n, G])."""
        self.pass_rate[indices] = scores.double().mean(dim=1)

    def metrics(self, batch) -> dict:
        seen = ~self.pass_rate.isnan()
        out = {"pool/retired": int(self.retired.sum()), "pool/unseen": int((~seen).sum()), "pool/epoch": self.epoch,
               # every prompt retired (no_positive_resampling): the option draws the whole pool again, said here
               "pool/all_retired": int(bool(len(self.retired)) and bool(self.retired.all()))}
        easy_border, hard_border = self.borders
        if easy_border is not None:
            easy, hard = int((self.pass_rate > easy_border).sum()), int((self.pass_rate < hard_border).sum())
            out.update({"pool/easy": easy, "pool/hard": hard, "pool/sorted": easy + hard})
        return out

    def state_dict(self) -> dict:
        return {"pass_rate": self.pass_rate.clone(), "retired": self.retired.clone(), "order": self.order.clone(),
                "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.pass_rate, self.retired = state["pass_rate"].clone(), state["retired"].clone()
        self.order, self.epoch = state["order"].clone(), int(state["epoch"])


@stateful("prompt_pool")
def prompt_pool(spec: RunSpec, task, policies) -> PromptPool | None:
    """The pool when the prompt_pool option draws from one, else None (the task's order)."""
    pool = spec.tricks["prompt_pool"]
    if not pool.option.pooled:
        return None
    size, seed = pool.values.get("size"), spec.seed
    return PromptPool(task.prompt_pool(None if size is None else int(size), seed), pool.fn, pool.option.epochs,
                      (pool.values.get("easy_border"), pool.values.get("hard_border")), seed)
