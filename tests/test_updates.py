"""PPO mini-batch updates (the `updates` family): several optimizer steps per rollout, where the
ratio, its clipping and every ratio-based trick act."""
import pytest
import torch

from grpo_ablate.config.compose import compose
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows
from grpo_ablate.train.grpo import train
from grpo_ablate.train.batch import mini_batch_rows
from grpo_ablate.tricks import option
from grpo_ablate.tricks.loss_agg import aggregate

D = torch.float64


def run(overrides, run_dir):
    return train(compose(overrides), run_dir, overrides)


def rows_of(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)}
            for r in read_rows(run_dir / "metrics.jsonl")]


def test_mini_batches_are_disjoint_whole_groups_seeded_by_their_key():
    group_index = torch.tensor([0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4])       # ragged groups (dynamic_group)
    parts = mini_batch_rows(group_index, 2, shuffle_seed=7)
    assert sorted(torch.cat(parts).tolist()) == list(range(11))           # every row once
    for rows in parts:                                                    # whole groups only
        groups = set(group_index[rows].tolist())
        assert all(set((group_index == g).nonzero().squeeze(1).tolist()) <= set(rows.tolist()) for g in groups)
    assert sorted(len(set(group_index[r].tolist())) for r in parts) == [2, 3]   # 5 groups into 2 + 3
    again = mini_batch_rows(group_index, 2, shuffle_seed=7)
    assert all(torch.equal(a, b) for a, b in zip(parts, again))           # the same key draws the same
    other = [mini_batch_rows(group_index, 2, shuffle_seed=s) for s in range(8)]
    assert len({tuple(p[0].tolist()) for p in other}) > 1                 # other keys shuffle differently
    assert mini_batch_rows(group_index, 1, shuffle_seed=7) == [None]      # one mini-batch: the batch as is
    assert len(mini_batch_rows(group_index, 9, shuffle_seed=None)) == 5   # never more slices than groups


def verl_agg_loss(loss, mask, mode, max_len):
    """verl core_algos.agg_loss on one mini-batch, written out (its loss_agg_mode names)."""
    if mode == "token-mean":
        return (loss * mask).sum() / mask.sum()
    per_seq = (loss * mask).sum(dim=1)
    live = mask.sum(dim=1) > 0
    if mode == "seq-mean-token-mean":
        return (per_seq[live] / mask.sum(dim=1)[live]).mean()
    if mode == "seq-mean-token-sum":
        return per_seq[live].mean()
    if mode == "seq-mean-token-sum-norm":          # Dr. GRPO: a constant normaliser
        return per_seq.sum() / (mask.shape[0] * max_len)
    raise ValueError(mode)


@pytest.mark.parametrize("ours, theirs", [("token_mean", "token-mean"), ("seq_mean_token_mean", "seq-mean-token-mean"),
                                          ("seq_mean_token_sum", "seq-mean-token-sum"),
                                          ("constant", "seq-mean-token-sum-norm")])
def test_each_mini_batch_is_aggregated_as_verl_agg_loss_does(ours, theirs):
    """token_mean counts that mini-batch's tokens, the seq modes its sequences (not the rollout's)."""
    loss = torch.tensor([[0.5, -1.0, 2.0, 0.0], [1.5, 0.25, 0.0, 0.0], [-0.75, 3.0, 1.0, -2.0],
                         [0.1, 0.2, 0.3, 0.4]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=D)
    weights_of = option("loss_agg", ours).impl
    for rows in (torch.tensor([0, 2]), torch.tensor([1, 3])):
        got = aggregate(loss[rows], weights_of(mask[rows], 4))
        torch.testing.assert_close(got, verl_agg_loss(loss[rows], mask[rows], theirs, 4))
    expected = {"token_mean": (0.5 - 1.0 + 2.0 - 0.75 + 3.0 + 1.0 - 2.0) / 7,     # rows 0 and 2: 7 tokens
                "seq_mean_token_mean": ((1.5 / 3) + (1.25 / 4)) / 2,
                "seq_mean_token_sum": (1.5 + 1.25) / 2, "constant": (1.5 + 1.25) / (2 * 4)}[ours]
    assert aggregate(loss[[0, 2]], weights_of(mask[[0, 2]], 4)).item() == pytest.approx(expected, abs=1e-12)


@pytest.fixture(scope="module")
def mini_batch_runs(tmp_path_factory, cache_dir):
    """clip=symmetric and clip=higher with 4 optimizer steps per rollout, and one with 1."""
    from conftest import SMALL

    # seed 1: a draw in which the upper clip binds by the second rollout (the held-out partition's
    # training stream; at seed 0 no positive-advantage token passes 1.2 in 3 rollouts)
    base = list(SMALL) + [f"model.cache_dir={cache_dir}", "steps=3", "kl=none", "optim.lr=3e-3", "seed=1"]
    out = {}
    for name, extra in {"sym": ["updates=mini_batches"], "higher": ["updates=mini_batches", "clip=higher"],
                        "single": []}.items():
        d = tmp_path_factory.mktemp(name)
        assert run(base + extra, d / "run").state == "completed"
        out[name] = rows_of(d / "run")
    return out


def test_several_optimizer_steps_per_rollout_make_the_ratio_act(mini_batch_runs):
    sym, single = mini_batch_runs["sym"][1:], mini_batch_runs["single"][1:]
    assert all(r["ppo/optimizer_steps"] == 4 for r in sym)
    assert any(r["clip/low_frac"] > 0 or r["clip/high_frac"] > 0 for r in sym)     # clipping acts
    assert any(r["ppo/ratio_max"] > 1.2 for r in sym) and any(r["ppo/kl"] != 0 for r in sym)
    # one optimizer step per rollout: pi_old is the policy itself, rho = 1, nothing clips
    assert all(r["ppo/optimizer_steps"] == 1 and r["ppo/ratio_min"] == r["ppo/ratio_max"] == 1.0
               and r["ppo/kl"] == 0 and r["clip/low_frac"] == r["clip/high_frac"] == 0 for r in single)


def test_clip_higher_changes_the_update_only_with_several_steps(mini_batch_runs):
    sym, higher = mini_batch_runs["sym"], mini_batch_runs["higher"]
    assert sym[1]["ppo/ratio_max"] == higher[1]["ppo/ratio_max"]   # the same first rollout ...
    assert any(a["loss"] != b["loss"] for a, b in zip(sym[1:], higher[1:]))   # ... updated differently


def test_mini_batch_runs_resume_exactly(small, tmp_path):
    args = small + ["updates=mini_batches", "updates.mini_batches=2", "updates.epochs=2", "optim.lr=1e-3"]
    run(args, tmp_path / "full")
    run([*args, "steps=2"], tmp_path / "part")
    run(args + ["resume=true"], tmp_path / "part")
    assert rows_of(tmp_path / "full") == rows_of(tmp_path / "part")


@pytest.mark.parametrize("extra", [["+trick=[critic_gae,value_clip]"], ["kl=two_layer", "temperature=learnable"]])
def test_mini_batches_work_with_a_critic_and_anchors(small, tmp_path, extra):
    args = small + ["steps=2", "updates=mini_batches", "updates.mini_batches=2"] + extra
    assert run(args, tmp_path / "run").state == "completed"
    rows = rows_of(tmp_path / "run")
    assert all(r["ppo/optimizer_steps"] == 2 for r in rows[1:])
    assert all(v is not None for r in rows for v in r.values())
