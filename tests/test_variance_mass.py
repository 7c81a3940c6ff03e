"""sampling=variance_mass (RAGEN-2's SNR-aware filtering; verl #7894, TRL #7242, SkyRL #2217): the groups
holding top_p of the batch's reward variance (ddof 1), highest first, or the top_k, are trained on and the
others masked. Float64 hand vectors (ties, the exact-reach boundary, include_zero, nothing to rank), SkyRL's
test batches, a plain walk of the definition on random batches, the trainer's batch and metrics, the
refusals and the inert rule; a real run in the full tier."""
import random
from types import SimpleNamespace

import pytest
import torch

from conftest import refused_train
from grpo_ablate.config.compose import compose
from grpo_ablate.config.inert import inert_reason
from grpo_ablate.config.spec import BoundOption
from grpo_ablate.sampling.decode import Rollout
from grpo_ablate.train.batch import sample_groups
from grpo_ablate.train.metrics import masked_group_metrics
from grpo_ablate.tricks import option
from grpo_ablate.tricks.sampling import group_reward_variance, keep_groups_by_variance_mass as keep

# G = 2, so each group's variance is (a - b)^2 / 2, exact in float64; the total is exactly 1:
#   g0 0.125, g1 0 (flat), g2 0.125, g3 0.5, g4 0.125, g5 0.125
# descending, ties in batch order: g3, g0, g2, g4, g5 (g1 has none); cumulative 0.5, 0.625, 0.75, 0.875, 1
HAND = torch.tensor([[1.0, 0.5], [1.0, 1.0], [0.0, 0.5], [0.0, 1.0], [0.25, 0.75], [0.5, 1.0]], dtype=torch.float64)


def kept(scores, **knobs) -> str:
    return "".join(str(g) for g, k in enumerate(keep(scores, **knobs).tolist()) if k)


def test_the_group_variance_is_the_sample_variance_and_exactly_zero_for_a_flat_group():
    assert group_reward_variance(HAND).tolist() == [0.125, 0.0, 0.125, 0.5, 0.125, 0.125]
    # ddof 1 by hand: [1, 0, 0, 0] has mean 1/4, squares 9/16 + 3/16 = 3/4, over G - 1 = 3: 1/4
    assert group_reward_variance(torch.tensor([[1.0, 0.0, 0.0, 0.0]])).item() == pytest.approx(0.25, abs=1e-15)
    # rounding in the mean of 0.1, 0.1, 0.1 never makes a flat group varied; a group of one has no variance
    assert group_reward_variance(torch.tensor([[0.1, 0.1, 0.1], [0.3, 0.3, 0.3]])).tolist() == [0.0, 0.0]
    assert group_reward_variance(torch.tensor([[1.0], [0.0]])).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("top_p, groups", [
    (0.5, "3"),          # 0.5 >= 0.5: reached exactly by the first group
    (0.6, "03"),         # 0.625 is the first prefix at or above 0.6
    (0.75, "023"),       # reached exactly at the third; of the four tied groups the first two in batch order
    (0.76, "0234"),      # one more tie, in batch order
    (0.875, "0234"),     # exactly reached
    (0.9, "02345"),
    (1.0, "02345"),      # every group with variance; the flat g1 never (it holds none)
])
def test_top_p_keeps_the_shortest_prefix_that_reaches_the_share_ties_in_batch_order(top_p, groups):
    assert kept(HAND, top_p=top_p) == groups


def test_include_zero_at_top_p_1_keeps_every_group_and_below_1_changes_nothing():
    assert kept(HAND, top_p=1.0, include_zero=True) == "012345"
    assert kept(HAND, top_p=0.9, include_zero=True) == kept(HAND, top_p=0.9) == "02345"


@pytest.mark.parametrize("top_k, include_zero, groups", [
    (1, False, "3"), (2, False, "03"), (3, False, "023"), (5, False, "02345"),
    (6, False, "02345"),          # only the five with variance are candidates
    (6, True, "012345"),          # the flat one last
])
def test_top_k_keeps_the_k_highest_ties_in_batch_order(top_k, include_zero, groups):
    assert kept(HAND, strategy="top_k", top_k=top_k, include_zero=include_zero) == groups


def test_a_batch_without_variance_keeps_every_group_the_first_k_with_include_zero():
    flat = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    assert kept(flat) == kept(flat, top_p=0.5, include_zero=True) == "012"     # nothing to rank: all trained
    assert kept(flat, strategy="top_k", top_k=2) == "012"                     # (the PRs would mask all)
    assert kept(flat, strategy="top_k", top_k=2, include_zero=True) == "01"   # SkyRL: the first top_k


def test_skyrls_test_batches():
    """SkyRL #2217's tests/test_reward_variance_filter.py (4f86c72d), selection_eps 0: groups of two."""
    batch = torch.tensor([[-3.0, 3.0], [-2.0, 2.0], [-1.0, 1.0]])   # variances 18, 8, 2
    assert kept(batch, top_p=0.8) == "01"
    assert masked_group_metrics(torch.tensor([True] * 4 + [False] * 2), batch.flatten(),
                                torch.arange(3).repeat_interleave(2))["sampling/kept_variance_frac"] == pytest.approx(
        26 / 28, abs=1e-15)
    assert kept(torch.tensor([[-1.0, 1.0], [-1.0, 1.0]]), top_p=0.5) == "0"                  # ties: first seen
    assert kept(batch, strategy="top_k", top_k=2) == "01"
    signal_and_flats = torch.tensor([[-1.0, 1.0], [0.0, 0.0], [1.0, 1.0]])
    assert kept(signal_and_flats, strategy="top_k", top_k=2) == "0"
    assert kept(signal_and_flats, strategy="top_k", top_k=2, include_zero=True) == "01"


def walk(variances: list[float], top_p: float, include_zero: bool) -> set[int]:
    """The definition, walked: candidates by variance, highest first, ties in batch order; add them
    until their sum reaches top_p of the total (every candidate if rounding never gets there)."""
    total = sum(variances)
    if total == 0 or (include_zero and top_p >= 1):
        return set(range(len(variances)))
    candidates = sorted((g for g, v in enumerate(variances) if include_zero or v > 0), key=lambda g: -variances[g])
    chosen, mass = set(), 0.0
    for g in candidates:
        chosen.add(g)
        mass += variances[g]
        if mass >= top_p * total:
            break
    return chosen


def test_top_p_is_the_walk_on_random_batches():
    rng = random.Random(0)
    for _ in range(300):
        groups, G = rng.randint(1, 10), rng.randint(2, 6)
        scores = torch.tensor([[rng.choice([0.0, 1.0]) if rng.random() < 0.7 else rng.random() for _ in range(G)]
                               for _ in range(groups)], dtype=torch.float64)
        top_p, include_zero = rng.choice([0.3, 0.5, 0.9, 1.0, rng.random()]), rng.random() < 0.3
        variances = group_reward_variance(scores).tolist()
        got = {g for g, k in enumerate(keep(scores, top_p=top_p, include_zero=include_zero).tolist()) if k}
        assert got == walk(variances, top_p, include_zero), (scores, top_p, include_zero)


# ------------------------------------------------------------------ the trainer's batch
class FakeRollouts:
    """G completions per prompt; a prompt 'a,b' scores its two completions a and b."""
    pad_id = 0

    def __call__(self, problems, n, temperature, key):
        rows, width = len(problems) * n, 3
        roll = Rollout(torch.arange(rows * (2 + width)).view(rows, 2 + width),
                       torch.ones(rows, 2 + width, dtype=torch.long), 2, torch.ones(rows, width),
                       torch.zeros(rows, dtype=torch.bool))
        scores = torch.tensor([float(s) for p in problems for s in p.split(",")])
        return SimpleNamespace(roll=roll, texts=[f"{p}/{j}" for p in problems for j in range(n)], scores=scores)


class Prompts:
    def __init__(self, problems):
        self.problems = problems

    def draw(self, n, step, sampling_round):
        return self.problems[:n], None

    def observe(self, indices, scores):
        return None


def test_every_group_stays_in_the_batch_and_the_trained_rows_are_the_kept_groups():
    opt = option("sampling", "variance_mass")
    bound = BoundOption(opt, {"max_rounds": 1}, {"top_p": 0.6}, opt.bind({"top_p": 0.6}))
    problems = [",".join(map(str, row)) for row in HAND.tolist()]
    batch = sample_groups(FakeRollouts(), Prompts(problems), 6, 2, bound, 1, 1.0)
    assert batch.problems == problems and len(batch.texts) == 12          # nothing dropped
    assert batch.trained.tolist() == [True, True, False, False, False, False, True, True] + [False] * 4
    metrics = masked_group_metrics(batch.trained, batch.scores, batch.group_index)
    assert metrics == {"sampling/masked_group_frac": 4 / 6, "sampling/kept_variance_frac": 0.625}
    static = option("sampling", "static")
    unmasked = sample_groups(FakeRollouts(), Prompts(problems), 6, 2,
                             BoundOption(static, {"max_rounds": 1}, {}, static.bind({})), 1, 1.0)
    assert unmasked.trained is None


def test_the_masked_group_metrics_by_hand_ragged_groups_too():
    # group 0: [1, 0, 0] (variance 1/3), group 1: [1, 1] (flat), group 2: [0, 1] (1/2); group 2 trained
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    index = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    trained = torch.tensor([False] * 5 + [True] * 2)
    m = masked_group_metrics(trained, scores, index)
    assert m["sampling/masked_group_frac"] == pytest.approx(2 / 3, abs=1e-15)
    assert m["sampling/kept_variance_frac"] == pytest.approx(0.5 / (1 / 3 + 0.5), abs=1e-15)
    assert masked_group_metrics(torch.ones(4, dtype=torch.bool), torch.ones(4), torch.tensor([0, 0, 1, 1])) == {
        "sampling/masked_group_frac": 0.0, "sampling/kept_variance_frac": 1.0}


# ------------------------------------------------------------------ config
@pytest.mark.parametrize("overrides, needle", [
    ("sampling=variance_mass sampling.top_p=0", "sampling.top_p=0 is not allowed; it must be a number in (0, 1]"),
    ("sampling=variance_mass sampling.top_p=1.5", "sampling.top_p=1.5 is not allowed"),
    ("sampling=variance_mass sampling.strategy=top_k sampling.top_k=9", "sampling.top_k=9 is not allowed"),
    ("sampling=variance_mass sampling.top_k=3", "sampling.top_k"),     # read only under strategy=top_k
    ("sampling=variance_mass sampling.strategy=top_q", "sampling.strategy='top_q' is not allowed"),
    ("sampling=variance_mass sampling.max_rounds=2", "sampling.max_rounds=2 is not allowed with "
                                                     "sampling=variance_mass, which samples one round"),
])
def test_bad_values_are_one_line_errors(overrides, needle, tmp_path):
    refused_train(overrides, needle, tmp_path)


@pytest.mark.parametrize("overrides, inert", [
    (["+trick=snr_aware_filtering"], False),
    (["sampling=variance_mass", "rollout.group_size=1"], True),
    (["sampling=variance_mass", "sampling.top_p=1", "sampling.include_zero=true"], True),
    (["sampling=variance_mass", "sampling.top_p=1"], False),        # masks the flat groups (zero_variance's)
    (["sampling=variance_mass", "sampling.strategy=top_k", "sampling.top_k=8", "sampling.include_zero=true"], True),
    (["sampling=variance_mass", "sampling.strategy=top_k", "sampling.top_k=4", "sampling.include_zero=true"], False),
])
def test_inert_where_it_keeps_every_group(overrides, inert):
    assert (inert_reason(compose(overrides), "sampling", "variance_mass") is not None) == inert


def test_the_named_trick_selects_the_option_at_the_prs_share():
    cfg = compose(["+trick=snr_aware_filtering"])
    assert (cfg.sampling.name, cfg.sampling.strategy, cfg.sampling.top_p, cfg.sampling.include_zero) == (
        "variance_mass", "top_p", 0.9, False)


# ------------------------------------------------------------------ a real run
def test_a_run_masks_groups_and_keeps_its_batch(small, tmp_path):
    from grpo_ablate.rundir.files import read_rows
    from grpo_ablate.train.grpo import train

    args = small + ["steps=2", "sampling=variance_mass", "sampling.top_p=0.5"]
    assert train(compose(args), tmp_path / "run", args).state == "completed"
    rows = [r for r in read_rows(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    assert all(r["sampling/kept_group_frac"] == 1.0 for r in rows)          # every group stays in the batch
    assert any(r["sampling/masked_group_frac"] > 0 for r in rows)
    assert all(0.5 <= r["sampling/kept_variance_frac"] <= 1 for r in rows)
