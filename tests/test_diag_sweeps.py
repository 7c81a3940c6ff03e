"""`sweep pairwise` and `sweep conflict`: their matrices (pure) and their planning through the CLI
(in-process, nothing launched)."""
import pytest

from grpo_ablate.sweep.matrix import SweepError
from grpo_ablate.sweep.modes import build_matrix
from test_sweep import FAMILIES, cli_here, names

REWARD_TERMS = frozenset({"length_penalty", "overlong_punish"})   # (of these tricks: the registry's shapes_reward)
FAMILIES = dict(FAMILIES, length_penalty="length")


def test_pairwise_is_base_each_trick_alone_and_each_pair():
    m = build_matrix("pairwise", ["clip_higher", "token_mean", "kl_adaptive"], FAMILIES)
    assert names(m) == ["base", "clip_higher", "token_mean", "kl_adaptive", "clip_higher+token_mean",
                        "clip_higher+kl_adaptive", "token_mean+kl_adaptive"]
    by = {v.name: v for v in m.variants}
    assert by["token_mean+kl_adaptive"].tricks_on == ("token_mean", "kl_adaptive")
    assert by["token_mean+kl_adaptive"].overrides == ("+trick=[token_mean,kl_adaptive]",)
    assert all(v.reference == "base" for v in m.variants[1:]) and m.variants[0].overrides == ()
    assert [(c.trick, c.with_, c.without) for c in m.contrasts] == [
        ("clip_higher", "clip_higher", "base"), ("token_mean", "token_mean", "base"),
        ("kl_adaptive", "kl_adaptive", "base")]
    with pytest.raises(SweepError, match="both set family 'loss_agg'"):
        build_matrix("pairwise", ["token_mean", "dr_grpo_norm"], FAMILIES)
    with pytest.raises(SweepError, match="at least two tricks"):
        build_matrix("pairwise", ["token_mean"], FAMILIES)


def test_conflict_is_base_trick_and_reward_term_with_diagnostics_on():
    m = build_matrix("conflict", ["clip_higher", "length_penalty"], FAMILIES, reward_terms=REWARD_TERMS)
    assert names(m) == ["base", "trick-clip_higher", "reward-length_penalty"]
    assert [v.overrides for v in m.variants] == [
        ("diag.grad_conflict=true",), ("+trick=[clip_higher]", "diag.grad_conflict=true"),
        ("+trick=[length_penalty]", "diag.grad_conflict=true")]
    assert [v.tricks_on for v in m.variants] == [(), ("clip_higher",), ("length_penalty",)]   # never both
    assert [(c.trick, c.with_, c.without) for c in m.contrasts] == [
        ("clip_higher", "trick-clip_higher", "base"), ("length_penalty", "reward-length_penalty", "base")]
    # a trick that shapes no reward is not a reward term
    with pytest.raises(SweepError, match="--reward overlong_filter adds no term to the reward; allowed: "
                                         "length_penalty, overlong_punish"):
        build_matrix("conflict", ["clip_higher", "overlong_filter"], FAMILIES, reward_terms=REWARD_TERMS)


def test_planning_pairwise_and_conflict(tmp_path, cache_dir):
    r = cli_here("sweep", "pairwise", "--tricks", "batch_norm,token_mean", "--seeds", "2", "--dry-run", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert "7 variants x 2 seeds" in r.stdout and "batch_norm+token_mean" in r.stdout   # + 3 controls
    assert "control-sft" in r.stdout and "control-rft" in r.stdout
    r = cli_here("sweep", "conflict", "--trick", "entropy_bonus", "--reward", "length_penalty", "--dry-run",
                 cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert "3 variants x 5 seeds" in r.stdout and "reward-length_penalty" in r.stdout
    assert "diag.grad_conflict=true" in r.stdout and "control-" not in r.stdout   # a diagnosis: no controls
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, message", [
    (["conflict", "--trick", "entropy_bonus"], "needs --trick X and --reward Y"),
    (["conflict", "--trick", "entropy_bonus", "--reward", "clip_higher"], "--reward clip_higher adds no term"),
    (["conflict", "--trick", "length_penalty", "--reward", "length_penalty"], "both name length_penalty"),
    (["conflict", "--tricks", "a,b"], "takes --trick X --reward Y, not --tricks"),
    (["leave-one-out", "--trick", "clip_higher"], "belong to `sweep conflict`"),
    (["conflict", "--trick", "nope", "--reward", "length_penalty"], "unknown trick nope"),
    (["conflict", "--trick", "clip_higher", "--reward", "length_group", "--base", "blog"], "already on in the base"),
    (["pairwise", "--tricks", "token_mean,dr_grpo_norm"], "both set family 'loss_agg'"),
])
def test_bad_input_is_one_line(args, message, tmp_path, cache_dir):
    r = cli_here("sweep", *args, "--dry-run", cwd=tmp_path)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
