"""Family `prompt_pool`: which training prompts a step draws, from what the run has observed of them.

The default, `task`, is the task's own order (the arithmetic task draws fresh problems every
step, a data task passes over its training set in seeded epochs); the trainer takes exactly the
path it takes without the family. Every other option draws from a finite pool of N prompts
(`prompt_pool.size` of them: a fixed seeded draw of the generated task, or the first `size` of a
seeded shuffle of a data task's training set; null = the whole set) and sees, for each prompt,
its latest observed pass rate p_i = mean_j score_ij over the G completions of its last group
(the verifier's scores in [0, 1], every sampled group counted, also those a `sampling` filter
drops; NaN until the prompt is first sampled). Every option takes (pass_rate [N] float64,
retired [N] bool, n, generator) and returns (indices [n] long, retired [N] bool):

    task        never called (the trainer draws with task.train_batch)
    epochs      the pool in seeded epochs: a fresh permutation of all N prompts per epoch
                (ScaleRL's control: every prompt resampled uniformly, epoch after epoch)
    no_positive_resampling
                epochs over the prompts not retired; at each epoch's start a prompt whose latest
                pass rate p_i >= max_pass (0.9) is retired for the rest of the run (ScaleRL,
                Khatri et al. 2025, arXiv 2510.13786, Sec. 3: "No-Positive-Resampling", prompts
                of pass rate >= 0.9 permanently removed from subsequent epochs, after POLARIS)
    difficulty  prime-rl's difficulty pool (orchestrator/buffer.py, DifficultyPoolBufferConfig,
                `buffer.type=difficulty-pool`): a prompt is easy when p_i > easy_border (0.8),
                hard when p_i < hard_border (0.2), otherwise (and unseen) normal; a draw of n
                takes floor(n easy_fraction) from the easy pool, floor(n hard_fraction) from the
                hard one and the rest from normal, each uniformly without replacement, a pool's
                deficit going to normal

Conventions that differ. ScaleRL keeps a history of pass rates; here the latest group's pass
rate decides (prime-rl's rule too). With G = 8 a pass rate >= 0.9 means all 8 correct. When every
prompt is retired, the epochs run over the whole pool again (pool/retired = N shows it; ScaleRL
does not say). prime-rl returns a smaller batch when even normal runs short; here the remainder
is drawn from the prompts not yet taken (then with replacement, past N), so a step always trains
on n prompts. prime-rl seeds Python's global `random` once; here each draw has its own generator
seeded by (seed, step, round) for `difficulty` and by (seed, epoch) for the epochs, and the pool's
pass rates, retired set and epoch position are checkpointed, so a resumed run draws exactly what
an uninterrupted one does (train/state/prompt_pool.py). Metrics: `pool/retired` (prompts retired so
far), `pool/unseen`, `pool/easy`, `pool/hard`, `pool/sorted` (easy + hard), `pool/epoch`.
"""
from __future__ import annotations

import math

from grpo_ablate.tricks.torch_on_first_use import torch  # imported when a trick runs

from grpo_ablate.tricks.registry import (FRACTION, NON_NEGATIVE, SCALERL, Activity, Allowed, Claim, Inert, Trick,
                                         choice, declare_family, register)

declare_family("prompt_pool", "which prompts a step draws: the task's own order, or a finite pool in epochs, with "
               "prompts of pass rate >= `max_pass` retired (ScaleRL no-positive-resampling), or prime-rl's "
               "easy/normal/hard difficulty pools", stage="batch", default="task", metric="pool/retired",
               settings={"size": (Allowed("integer", low=0, low_open=True, optional=True,
                                       note="the pool's prompts; null: a data task's whole training set"), "pooled")},
               defaults={"size": 64})


def _draws(cfg) -> int:
    """The most prompts a run draws: steps x prompts_per_step x sampling rounds (a refill round
    draws at most prompts_per_step), the first round over_sample times more (sampling=dynamic_fallback)."""
    B, rounds = int(cfg.rollout.prompts_per_step), int(cfg.sampling.max_rounds)
    return int(cfg.steps) * (math.ceil(float(cfg.sampling.get("over_sample") or 1) * B) + B * (rounds - 1))


def _one_epoch(cfg) -> bool:
    size = cfg.prompt_pool.get("size")
    return size is not None and _draws(cfg) <= int(size)


ONE_EPOCH = Inert(_one_epoch, "cannot act: the run draws no more prompts (steps x prompts_per_step x "
                  "sampling.max_rounds) than the pool holds, so it never starts a second epoch",
                  "lower prompt_pool.size or train more steps", "steps x prompts_per_step x max_rounds > size")


def _no_pool_reachable(cfg) -> bool:
    p = cfg.prompt_pool
    if p.get("draw", "fractions") == "weights":    # every pool weighs as an unseen prompt: a uniform draw
        return float(p.easy_weight) == float(p.normal_weight) == float(p.hard_weight) == 1
    return float(p.easy_border) >= 1 and float(p.hard_border) <= 0


NO_POOLS = Inert(_no_pool_reachable, "cannot act: no pass rate is above easy_border=1 or below hard_border=0, "
                 "so every prompt stays normal and the draw is uniform (draw=weights: every pool weighs 1, as an "
                 "unseen prompt does)",
                 "set easy_border < 1 or hard_border > 0 (draw=weights: a pool weight other than 1)",
                 "easy_border < 1 or hard_border > 0; with draw=weights, a pool weight other than 1")


def _check_size(cfg):
    """A generated task (the arithmetic one) has no training set to pool: the pool needs a size."""
    size, per_step = cfg.prompt_pool.get("size"), cfg.rollout.prompts_per_step
    if size is None and cfg.task.name == "arithmetic":
        return ("prompt_pool.size=null is not allowed with task=arithmetic: it generates its problems, so the pool "
                "needs a size (an integer > 0)")
    if size is not None and size < per_step:   # a batch draws distinct prompts: it would repeat one every step
        return (f"prompt_pool.size={size} is smaller than rollout.prompts_per_step={per_step}: every batch would "
                f"repeat a prompt; give a size >= {per_step}")
    return None


def _check_borders(cfg):
    p = cfg.prompt_pool
    if float(p.hard_border) > float(p.easy_border):
        return (f"prompt_pool.hard_border={p.hard_border} is above easy_border={p.easy_border}: "
                "a prompt cannot be both hard and easy")
    if p.get("draw", "fractions") == "weights" and not max(float(p.easy_weight), float(p.normal_weight),
                                                           float(p.hard_weight)) > 0:
        return "prompt_pool.draw=weights needs a pool with a positive weight (easy_weight, normal_weight, hard_weight)"
    if float(p.easy_fraction) + float(p.hard_fraction) > 1:
        return (f"prompt_pool.easy_fraction + hard_fraction = {float(p.easy_fraction) + float(p.hard_fraction):g} "
                "is above 1")
    return None


# What each draw of prompt_pool=difficulty reads beyond the borders.
DRAW_READS = {"fractions": ("easy_fraction", "hard_fraction"),
              "weights": ("easy_weight", "normal_weight", "hard_weight")}


def _check_draw(cfg):
    """A knob only the other draw reads, set away from its default, would be ignored: refused."""
    p = cfg.prompt_pool
    draw, defaults = p.get("draw", "fractions"), difficulty_pools.__kwdefaults__
    for other, keys in DRAW_READS.items():
        changed = [k for k in keys if other != draw and float(p[k]) != defaults[k]]
        if changed:
            return (f"prompt_pool.{changed[0]}={p[changed[0]]} is read only by prompt_pool.draw={other}, and "
                    f"draw={draw} ignores it; set prompt_pool.draw={other}, or leave {changed[0]} at "
                    f"{defaults[changed[0]]:g}")
    return None


def _permutation(candidates: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return candidates[torch.randperm(len(candidates), generator=generator)]


@register("prompt_pool", "task",
          what="the task's own order: fresh arithmetic problems every step, or a data task's seeded epochs")
def task_order(pass_rate: torch.Tensor, retired: torch.Tensor, n: int, generator: torch.Generator):
    """Never called: the trainer draws with the task's own train_batch (today's path)."""
    return torch.arange(n) % len(pass_rate), retired


@register("prompt_pool", "epochs",
          what="a finite pool of prompts in seeded epochs, every prompt resampled (ScaleRL's control for "
               "no-positive-resampling)",
          notes={"size": "prompts in the pool (null: a data task's whole training set)"},
          pooled=True, epochs=True, checks=_check_size)
def epoch_order(pass_rate: torch.Tensor, retired: torch.Tensor, n: int, generator: torch.Generator):
    """One epoch: a permutation of the whole pool (n = N), nothing retired."""
    return _permutation(torch.arange(len(pass_rate)), generator)[:n], retired


@register("prompt_pool", "no_positive_resampling",
          what="ScaleRL no-positive-resampling: a prompt whose latest pass rate reached max_pass leaves the pool for "
               "the rest of the run (it is left out of every later epoch)",
          notes={"size": "prompts in the pool (null: a data task's whole training set)",
                 "max_pass": "ScaleRL's bound (with G = 8: all 8 correct)"},
          pooled=True, epochs=True,
          knobs={"max_pass": Allowed(low=0, low_open=True, high=1,
                                  note="a prompt whose latest pass rate reaches it leaves the pool")},
          activity=Activity("pool/retired"), inert=ONE_EPOCH, checks=_check_size,
          tricks=(Trick("no_positive_resampling",
                        what="prompts whose pass rate reached max_pass (0.9) leave the pool for the rest of the run",
                        source="ScaleRL (arXiv 2510.13786, Sec. 3 'No-Positive-Resampling', after POLARIS); "
                               "prime-rl buffer easy_threshold (easy prompts not sampled again)",
                        verdict="not_in_review", cost="none (fewer easy groups sampled)",
                        claims=(Claim("helps", "", SCALERL,
                                      "no-positive-resampling (prompts of pass rate >= 0.9 removed from later "
                                      "epochs) is part of the ScaleRL recipe; the data curriculum moves compute "
                                      "efficiency, not the asymptote"),)),))
def retire_solved(pass_rate: torch.Tensor, retired: torch.Tensor, n: int, generator: torch.Generator, *,
                  max_pass: float = 0.9):
    """One epoch over the prompts not retired, after retiring those whose latest pass rate >= max_pass
    (NaN, unseen, never retires). Every prompt retired: the epoch runs over the whole pool."""
    retired = retired | (pass_rate >= float(max_pass))
    active = (~retired).nonzero().squeeze(1)
    if len(active) == 0:
        active = torch.arange(len(pass_rate))
    return _permutation(active, generator)[:n], retired


def pool_weights(pass_rate: torch.Tensor, borders: tuple, weights: tuple) -> torch.Tensor:
    """[N] prime-rl DifficultyPoolSampler's weight of each prompt: (easy, normal, hard) weights by
    p > easy_border, hard_border < p <= easy_border, p <= hard_border; 1 for an unseen prompt (NaN)."""
    (easy_border, hard_border), (easy, normal, hard) = borders, weights
    pass_rate = pass_rate.to(torch.float64)
    out = torch.full_like(pass_rate, float(easy))
    out[pass_rate <= float(easy_border)] = float(normal)
    out[pass_rate <= float(hard_border)] = float(hard)
    out[torch.isnan(pass_rate)] = 1.0
    return out


@register("prompt_pool", "difficulty",
          what="prime-rl's difficulty pool (buffer type=difficulty-pool): prompts easy (pass rate > easy_border), "
               "hard (< hard_border) or normal by their last group; a step draws these fractions of each",
          notes={"size": "prompts in the pool (null: a data task's whole training set)",
                 "easy_border": "prime-rl's defaults",
                 "draw": "fractions (prime-rl's difficulty-pool buffer) | weights (its DifficultyPoolSampler)",
                 "easy_weight": "draw=weights: each prompt's weight by its pool (prime-rl's defaults; unseen: 1)"},
          pooled=True,
          knobs={"easy_border": FRACTION, "hard_border": FRACTION, "easy_fraction": FRACTION,
                 "hard_fraction": FRACTION, "draw": choice("fractions", "weights"), "easy_weight": NON_NEGATIVE,
                 "normal_weight": NON_NEGATIVE, "hard_weight": NON_NEGATIVE},
          activity=Activity("pool/sorted"), inert=NO_POOLS, checks=(_check_size, _check_draw, _check_borders),
          tricks=(Trick("difficulty_curriculum",
                        what="prompts bucketed easy/normal/hard by their last pass rate, drawn in set ratios "
                             "(10% easy, 10% hard, the rest normal)",
                        source="prime-rl orchestrator buffer type=difficulty-pool (easy_border 0.8, hard_border "
                               "0.2, easy_fraction 0.1, hard_fraction 0.1)",
                        verdict="not_in_review", cost="none"),
                  Trick("difficulty_pool_sampler",
                        what="each prompt drawn with a weight by its pool: 0.2 hard (p <= 0.25), 1 normal, 0.2 easy "
                             "(p > 0.75), 1 unseen",
                        source="prime-rl curriculum sampler type=difficulty_pool (DifficultyPoolSampler)",
                        verdict="not_in_review", cost="none",
                        settings={"draw": "weights", "easy_border": 0.75, "hard_border": 0.25})))
def difficulty_pools(pass_rate: torch.Tensor, retired: torch.Tensor, n: int, generator: torch.Generator, *,
                     easy_border: float = 0.8, hard_border: float = 0.2, easy_fraction: float = 0.1,
                     hard_fraction: float = 0.1, draw: str = "fractions", easy_weight: float = 0.2,
                     normal_weight: float = 1.0, hard_weight: float = 0.2):
    """`draw: fractions` (prime-rl's difficulty-pool buffer): n prompts, floor(n easy_fraction) easy
    (p > easy_border), floor(n hard_fraction) hard (p < hard_border), the rest normal (unseen prompts
    are normal), each without replacement; a short pool's deficit is drawn from normal, then from
    any prompt not yet taken.

    `draw: weights` (prime-rl's `DifficultyPoolSampler`, src/prime_rl/orchestrator/curriculum/samplers/
    pool.py, commit 559b447; DifficultyPoolSamplerConfig's pools hard <= 0.25 weight 0.2, normal
    <= 0.75 weight 1, easy the rest weight 0.2): each of the n prompts drawn independently, with
    replacement, with probability proportional to its pool's weight: hard_weight when p <= hard_border
    (inclusive, as prime-rl's thresholds), normal_weight when p <= easy_border, else easy_weight; an
    unseen prompt weighs 1. Differences: prime-rl raises when every weight is 0; here that config is
    refused, and a draw whose prompts all weigh 0 falls back to uniform. pool/hard counts p < hard_border."""
    if draw == "weights":
        weights = pool_weights(pass_rate, (easy_border, hard_border), (easy_weight, normal_weight, hard_weight))
        weights = weights if weights.sum() > 0 else torch.ones_like(weights)
        return torch.multinomial(weights, n, replacement=True, generator=generator), retired
    easy = pass_rate > float(easy_border)
    hard = pass_rate < float(hard_border)
    normal = ~(easy | hard)                       # NaN compares False: unseen prompts are normal
    n_easy, n_hard = int(n * float(easy_fraction)), int(n * float(hard_fraction))
    taken = torch.zeros(len(pass_rate), dtype=torch.bool)
    chosen = []

    def take(pool: torch.Tensor, want: int) -> int:
        candidates = _permutation((pool & ~taken).nonzero().squeeze(1), generator)[:max(want, 0)]
        taken[candidates] = True
        chosen.append(candidates)
        return want - len(candidates)

    deficit = take(easy, n_easy) + take(hard, n_hard)
    short = take(normal, n - n_easy - n_hard + deficit)
    if short > 0:                                  # every pool short: any prompt not yet taken, then repeats
        short = take(torch.ones_like(taken), short)
    if short > 0:
        chosen.append(torch.randint(len(pass_rate), (short,), generator=generator))
    return torch.cat(chosen), retired
