"""The sampling family's refill policy (verl #7082: DAPO evicts k groups and refills 2k in sync mode, k in
async; `sampling.refill`) and slime's dynamic-sampling fallback (#2250: a zero-std group is kept when dropping
it would leave too few to fill the batch; `sampling=dynamic_fallback`): hand-worked rounds through the
trainer's `sample_groups`, the fallback against a literal walk of slime's loop, and every new value's refusal."""
import random
from types import SimpleNamespace

import pytest
import torch

from conftest import refused_train
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.sampling.decode import Rollout
from grpo_ablate.config.spec import BoundOption
from grpo_ablate.train.batch import sample_groups
from grpo_ablate.train.metrics import sampling_metrics
from grpo_ablate.tricks import option
from grpo_ablate.tricks.sampling import round_prompts

G = 2
GROUPS = {"V": [1.0, 0.0], "F": [1.0, 1.0], "Z": [0.0, 0.0]}   # varied, flat (all right), flat (all wrong)


class Stream:
    """A prompt source handing out labelled prompts in order; records each round's size."""

    def __init__(self, labels: str):
        self.labels, self.sizes = list(labels), []

    def draw(self, n, step, sampling_round):
        self.sizes.append(n)
        taken, self.labels = self.labels[:n], self.labels[n:]
        return [f"{label}{len(self.labels)}{i}" for i, label in enumerate(taken)], None

    def observe(self, indices, scores):
        return None


class FakeRollouts:
    """G completions per prompt, scored by its label (V, F or Z)."""
    pad_id = 0

    def __call__(self, problems, n, temperature, key):
        rows, width = len(problems) * n, 3
        roll = Rollout(torch.arange(rows * (2 + width)).view(rows, 2 + width),
                       torch.ones(rows, 2 + width, dtype=torch.long), 2, torch.ones(rows, width),
                       torch.zeros(rows, dtype=torch.bool))
        scores = torch.tensor([s for p in problems for s in GROUPS[p[0]]])
        return SimpleNamespace(roll=roll, texts=[f"{p}/{j}" for p in problems for j in range(n)], scores=scores)


def bound(name, **values):
    opt = option("sampling", name)
    return BoundOption(opt, values, {}, opt.bind({}))


def sample(labels, B, name="dynamic", **values):
    stream = Stream(labels)
    batch = sample_groups(FakeRollouts(), stream, B, G, bound(name, **values), 1, 1.0)
    return batch, stream.sizes


# ------------------------------------------------------------------ refill policy (verl c88e875dd)
def test_round_prompts_is_verls_refill_matrix():
    B = 8
    assert round_prompts(None, B, 5, 5, 0) == round_prompts("batch", B, 5, 5, 0) == (8, 0)  # a gen batch a round
    assert round_prompts("exact", B, 5, 3, 0) == (5, 0)      # async: k evicted, k refilled (what is missing)
    assert round_prompts("double", B, 3, 3, 0) == (6, 0)     # sync: 2k credits, all dispatched
    assert round_prompts("double", B, 6, 6, 0) == (8, 4)     # 12 credits, the in-flight limit B: 4 carried
    assert round_prompts("double", B, 5, 1, 4) == (6, 0)     # the carried 4 + 2 for the new eviction


@pytest.mark.parametrize("refill, labels, sizes, kept", [
    # B = 4. Round 1 keeps V0 V1 V3 (F2 dropped): one group missing.
    (None, "VVFV" "FVVV", [4, 4], "VVVV"),          # B fresh prompts again; the surplus V's are never kept
    ("double", "VVFV" "FV", [4, 2], "VVVV"),         # 2 x 1 dropped = 2 prompts; F dropped, V fills it
    ("exact", "VVFV" "F" "V", [4, 1, 1], "VVVV"),    # exactly the missing one, twice (the first is flat)
    # round 1 drops 3: double asks 6, at most B = 4 a round, 2 carried; round 2 drops 2 more: 2 + 4 -> 4
    ("double", "ZVFZ" "FVZV" "VVVV", [4, 4, 4], "VVVV"),
])
def test_refill_rounds_draw_what_verl_refills(refill, labels, sizes, kept):
    batch, drawn = sample(labels, 4, refill=refill, max_rounds=4)
    assert drawn == sizes and batch.rounds == len(sizes) and batch.drawn == sum(sizes)
    assert "".join(p[0] for p in batch.problems) == kept
    assert batch.scores.view(-1, G).tolist() == [GROUPS["V"]] * 4


def test_refill_metrics_count_the_prompts_drawn_not_rounds_times_B():
    batch, _ = sample("VVFV" "FV", 4, refill="double", max_rounds=4)
    m = sampling_metrics(batch.rounds, len(batch.problems), len(batch.texts), 4, G, batch.drawn)
    assert m["sampling/kept_group_frac"] == pytest.approx(4 / 6)          # 4 kept of 6 drawn
    assert m["sampling/extra_generations"] == 4                          # 12 completions for a batch of 8
    # every round B (drawn 0, as before the refill policy): the same numbers as rounds x B
    assert sampling_metrics(2, 4, 8, 4, G) == sampling_metrics(2, 4, 8, 4, G, drawn=8)


def test_refill_runs_out_of_rounds_and_trains_on_what_it_kept():
    batch, drawn = sample("ZZZV" "ZZZ" "ZZF", 4, refill="exact", max_rounds=3)
    assert drawn == [4, 3, 3] and "".join(p[0] for p in batch.problems) == "V"
    batch, drawn = sample("ZZZZ" "ZFZZ", 4, refill="exact", max_rounds=2)   # nothing kept: the last round's B
    assert drawn == [4, 4] and "".join(p[0] for p in batch.problems) == "ZFZZ" and len(batch.texts) == 4 * G


# ------------------------------------------------------------------ fallback (slime 2a60f00dd)
def slime_walk(flat: list[bool], target: int) -> list[bool]:
    """slime's generate_rollout_async with one over-sampled submission, literally: remaining_batch_size
    counts the submitted groups not dropped; a group is dropped when the filter rejects it and, for the
    fallback filter, remaining_batch_size > target (should_drop_dynamic_filter_output); `data` stops at
    the target."""
    remaining, data = len(flat), []
    for g, is_flat in enumerate(flat):
        if is_flat and not remaining <= target:
            remaining -= 1
            continue
        if len(data) < target:
            data.append(g)
    return [g in data for g in range(len(flat))]


def test_fallback_keeps_a_flat_group_once_dropping_it_would_leave_too_few():
    fill = option("sampling", "dynamic_fallback").impl
    scores = torch.tensor([GROUPS[x] for x in "FVZFVZ"], dtype=torch.float64)
    # 6 candidates for 3: F0 dropped (5 left), V1 kept, Z2 dropped (4), F3 dropped (3), V4 kept, Z5: 3 left
    # for 3 wanted, kept
    assert fill(scores, needed=3).tolist() == [False, True, False, False, True, True]
    assert fill(scores, needed=4).tolist() == [False, True, False, True, True, True]   # F3: 4 left for 4
    assert fill(scores, needed=6).tolist() == [True] * 6          # no candidate to spare: sampling=static
    assert fill(scores, needed=1).tolist() == [False, True, False, False, True, False]  # the trainer keeps V1


def test_fallback_is_slimes_walk_on_random_rounds():
    fill = option("sampling", "dynamic_fallback").impl
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 12)
        target = rng.randint(1, n)
        labels = [rng.choice("VFZ") for _ in range(n)]
        keep = fill(torch.tensor([GROUPS[x] for x in labels]), needed=target)
        capped = keep & (keep.cumsum(0) <= target)            # the trainer's cap: the first `needed` kept
        assert capped.tolist() == slime_walk([x != "V" for x in labels], target), labels
        assert int(capped.sum()) == target                     # always full: no second round


def test_fallback_samples_one_over_sampled_round_and_fills_the_batch():
    batch, drawn = sample("FVZFVZ", 3, "dynamic_fallback", over_sample=2, max_rounds=1)
    assert drawn == [6] and batch.rounds == 1 and [p[0] for p in batch.problems] == ["V", "V", "Z"]
    assert batch.scores.tolist() == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    batch, drawn = sample("FVZFV", 3, "dynamic_fallback", over_sample=1.5, max_rounds=1)   # ceil(4.5) = 5
    # F0 dropped (4 left), V1 kept, Z2 dropped (3 left for 3), F3 kept, V4 kept
    assert drawn == [5] and [p[0] for p in batch.problems] == ["V", "F", "V"]


def test_plain_dynamic_drops_what_the_fallback_keeps():
    batch, drawn = sample("FVZFVZ", 3, max_rounds=2)          # rounds of B = 3: FVZ, FVZ
    assert drawn == [3, 3] and [p[0] for p in batch.problems] == ["V", "V"]


# ------------------------------------------------------------------ config
def test_named_refill_and_fallback_tricks_compose():
    for trick, refill in (("dapo_refill_double", "double"), ("dapo_refill_exact", "exact")):
        cfg = compose([f"+trick={trick}"])
        validate(cfg)
        assert (cfg.sampling.name, cfg.sampling.refill, cfg.sampling.max_rounds) == ("dynamic", refill, 4)
    cfg = compose(["+trick=dynamic_sampling_fallback"])
    validate(cfg)
    assert (cfg.sampling.name, cfg.sampling.over_sample, cfg.sampling.max_rounds) == ("dynamic_fallback", 2, 1)
    validate(compose(["sampling=advantage_range", "+sampling.refill=exact"]))


@pytest.mark.parametrize("overrides, needle", [
    ("sampling=dynamic +sampling.refill=half", "sampling.refill"),
    ("sampling=dynamic_fallback sampling.over_sample=0.5", "sampling.over_sample"),
    ("sampling=dynamic_fallback sampling.max_rounds=2", "sampling.max_rounds=2 is not allowed"),
    ("sampling=static +sampling.refill=double", "refill"),
])
def test_a_bad_refill_or_fallback_value_is_one_line_exit_2_and_no_run_dir(tmp_path, overrides, needle):
    refused_train(overrides, needle, tmp_path)
