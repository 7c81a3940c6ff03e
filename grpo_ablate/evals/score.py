"""One eval of a policy on the held-out problems under a protocol: sample, grade, tally. The run
skeleton calls it at step 0 and on the eval schedule (train/run.py), and `grpo-ablate eval` on a
finished run's kept weights (rescore/command.py); both get the same numbers for the same weights.

The eval's draws are its own: keyed by (the run's seed, "eval", the step), per row of the whole
eval (sampling/decode.RowNoise; vLLM: a seed per prompt from the same key), never from the
training stream. So changing the protocol changes no training draw, the same weights scored at
the same step give the same samples in the run and after it, and two arms of a sweep at the same
seed and step share their eval draws (common random numbers: what pairing on seeds then removes).
"""
from __future__ import annotations

import hashlib

import torch

from grpo_ablate.evals.protocol import EvalProtocol
from grpo_ablate.evals.scores import ProblemScores, tally_votes
from grpo_ablate.rundir.files import EVAL_SCORES
from grpo_ablate.sampling.decode import derived_seed
from grpo_ablate.sampling.engines import Rollouts
from grpo_ablate.sampling.filters import SamplingFilters

ROWS_PER_CALL = 1024   # completions sampled at once: the rows of a sampled eval (P x n) in pieces of whole problems


def eval_set_fingerprint(problems) -> str:
    """Which problems an eval scored (evals.jsonl's `set`): the hash of their prompts, in order."""
    return hashlib.sha1("\x00".join(p.prompt for p in problems).encode()).hexdigest()[:12]


def evaluate(policy, rollouts: Rollouts, problems, protocol: EvalProtocol, *, seed: int, step: int,
             max_new_tokens: int, answer=None) -> dict:
    """The eval's metrics (evals/scores.py: eval/accuracy, eval/pass@k, eval/maj@k; the completions'
    length and truncation) and, under EVAL_SCORES, its ProblemScores for evals.jsonl. `answer`:
    the task's answer parser (maj@k's votes), None when it has none."""
    policy.eval()
    n = 1 if protocol.greedy else protocol.samples
    if protocol.greedy:   # one call, as every eval before sampled ones: the same numbers as they gave
        parts = [rollouts(problems, 1, 0.0, ("eval",), max_new_tokens=max_new_tokens)]
    else:
        total, draws = len(problems) * n, derived_seed(seed, ("eval", int(step)))
        filters = SamplingFilters(protocol.top_k, protocol.top_p, protocol.min_p)
        per_call = max(1, ROWS_PER_CALL // n)
        parts = [rollouts(problems[start:start + per_call], n, protocol.temperature, ("eval", step),
                          max_new_tokens=max_new_tokens, draws=(draws, start * n, total), filters=filters,
                          trained=False)
                 for start in range(0, len(problems), per_call)]
    correct = torch.cat([p.scores for p in parts]).reshape(len(problems), n).double().numpy()
    votes = None
    if protocol.maj_k and answer is not None:
        texts = [t for p in parts for t in p.texts]
        votes = tuple(tuple(tally_votes([answer(t) for t in texts[i * n:(i + 1) * n]],
                                        [bool(x >= 1.0) for x in correct[i]])) for i in range(len(problems)))
    scores = ProblemScores(eval_set_fingerprint(problems), correct, votes)
    lengths = torch.cat([p.roll.lengths.float() for p in parts])
    truncated = torch.cat([p.roll.truncated.float() for p in parts])
    return {**scores.summaries(protocol), EVAL_SCORES: scores,
            "eval/length_mean": lengths.mean().item(), "eval/truncated_frac": truncated.mean().item()}
