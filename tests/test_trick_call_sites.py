"""The call sites in the trainer of the tricks outside the seed review: each reaches the loss or the
advantage the way its function's docstring says, the state it owns survives a resume, and
diagnostics do not change what it draws."""
from types import SimpleNamespace

import torch

from grpo_ablate.config.compose import compose
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows
from grpo_ablate.config.spec import run_spec
from grpo_ablate.train.grpo import train
from grpo_ablate.train.losses import Coefficients, LossInputs, LossTerms, SeededDraws, loss_draws
from grpo_ablate.train.rewards import AdvantageChain, RewardShaping
from grpo_ablate.tricks.adv.group import gdpo_advantage
from grpo_ablate.tricks.kl import k3
from grpo_ablate.tricks.loss_agg import aggregate, seq_mean_token_mean_weights
from grpo_ablate.tricks.rollout_correction.weights import _option

D = torch.float64
NO_TERMS = Coefficients(kl=0.0, kl_prev=0.0, entropy=0.0, value=0.0)


def tricks_of(overrides):
    """The bound options of a composed config (what the trainer's parts receive)."""
    return run_spec(compose(overrides)).tricks


def run(overrides, run_dir):
    return train(compose(overrides), run_dir, overrides)


def rows_of(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)}
            for r in read_rows(run_dir / "metrics.jsonl")]


def test_gdpo_gets_the_reward_components():
    group_index = torch.tensor([0, 0, 0, 1, 1, 1])
    mask = torch.ones(6, 3, dtype=D)
    task = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=D)
    length = torch.tensor([-0.1, -0.5, 0.0, -0.2, -0.9, -0.3], dtype=D)
    components = {"task_reward": task, "length_reward": length}
    chain = AdvantageChain(tricks_of(["adv=gdpo"]))
    got = chain(task + length, group_index, mask, None, components).values
    assert torch.equal(got, gdpo_advantage(task + length, group_index, mask, None, components))
    assert not torch.allclose(got, chain(task + length, group_index, mask).values)   # {}: one part


def roll_of(mask):
    n = mask.shape[0]
    return SimpleNamespace(completion_mask=mask, lengths=mask.sum(1), truncated=torch.zeros(n, dtype=torch.bool),
                           sampled=None)   # a single completion: no environment token


def test_kl_in_reward_charges_the_chosen_estimator():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=D)
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.7, -3.0]], dtype=D)
    ref = torch.tensor([[-1.5, -1.0, -9.0], [-0.4, -1.7, -2.0]], dtype=D)
    spec = run_spec(compose(["kl=in_reward", "kl.estimator=k3"]))
    shaping = RewardShaping(spec.tricks, spec.reward, spec.rollout.max_new_tokens, SimpleNamespace(), reward_beta=0.5)
    shaped = shaping(torch.zeros(2, dtype=D), ["", ""], roll_of(mask), torch.tensor([0, 0]), old, ref)
    assert torch.allclose(shaped.components["kl_reward"], -0.5 * (k3(old, ref) * mask).sum(1))
    assert torch.allclose(shaped.rewards, shaped.components["kl_reward"])


def inputs_and_logp(seed=0, n=4, t=6):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, t, dtype=D)
    mask[0, 4:] = 0
    logp = (-torch.rand(n, t, generator=g, dtype=D) * 2).requires_grad_()
    adv = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]], dtype=D)
    return logp, LossInputs(mask, adv, old_logp=logp.detach() + 0.01 * torch.randn(n, t, generator=g, dtype=D))


def test_the_high_entropy_mask_zeroes_the_policy_gradient_of_the_other_tokens():
    logp, inputs = inputs_and_logp()
    entropy = torch.arange(24, dtype=D).view(4, 6)
    terms, stats = LossTerms(tricks_of(["token_mask=high_entropy", "token_mask.quantile=0.25"]))(
        logp, entropy, None, inputs, NO_TERMS)
    terms["policy"].sum().backward()
    # the 0.75-quantile of the 22 trained entropies (0-3, 6-23): 17 + 0.75 (18 - 17)
    kept = (entropy >= 17.75) & (inputs.mask > 0)
    assert torch.equal(logp.grad != 0, kept)
    assert torch.equal(stats["token_mask/dropped_frac"], inputs.mask * ~kept)


def test_rollout_correction_weights_multiply_the_policy_loss_only():
    logp, inputs = inputs_and_logp()
    plain, _ = LossTerms(tricks_of([]))(logp, torch.zeros_like(logp), None, inputs, NO_TERMS)
    sampler = inputs.old_logp - 0.3 * torch.rand(logp.shape, dtype=D)
    weights, metrics = _option("token", "truncate", 2.0, None)(inputs.old_logp, sampler, inputs.mask)
    inputs.sampler_logp, inputs.is_weights = sampler, weights
    weighted, _ = LossTerms(tricks_of(["rollout_correction=token_truncate"]))(logp, torch.zeros_like(logp), None,
                                                                             inputs, NO_TERMS)
    assert torch.equal(weighted["policy"], plain["policy"] * weights) and metrics["rollout_corr/kl"] != 0


def test_the_off_policy_mask_drops_negative_sequences_far_from_the_sampler():
    logp, inputs = inputs_and_logp()
    inputs.sampler_logp = logp.detach() + torch.tensor([[1.0], [1.0], [0.0], [0.0]], dtype=D)  # rows 0, 1 drift
    terms, stats = LossTerms(tricks_of(["off_policy_mask=sequence"]))(logp, torch.zeros_like(logp), None, inputs,
                                                                      NO_TERMS)
    terms["policy"].sum().backward()
    assert logp.grad[1].abs().sum() == 0 and logp.grad[0].abs().sum() > 0 and logp.grad[3].abs().sum() > 0  # A_0 > 0
    assert stats["off_policy_mask/dropped_frac"][1].sum() == 6 and stats["off_policy_mask/dropped_frac"].sum() == 6


def test_clip_cov_draws_from_the_trainers_seeded_generator():
    assert loss_draws(tricks_of([])["clip"], 0) is None     # a loss that draws nothing has none
    draws = loss_draws(tricks_of(["clip=clip_cov"])["clip"], 3)
    assert isinstance(draws, SeededDraws)
    state = draws.state_dict()
    first = torch.randperm(50, generator=draws.generator)
    with draws.unchanged():
        torch.randperm(50, generator=draws.generator)
    second = torch.randperm(50, generator=draws.generator)
    draws.load_state_dict(state)
    assert torch.equal(torch.randperm(50, generator=draws.generator), first)
    assert torch.equal(torch.randperm(50, generator=draws.generator), second)


# clip.ratio 0.2: enough tokens drawn that every rollout with a varied group clips some (at 0.05 a
# rollout with two varied groups of the tiny batch can draw none)
CLIP_COV_REF_SYNC = ["clip=clip_cov", "clip.ratio=0.2", "ref_sync=mixup", "ref_sync.every=3",
                     "updates=mini_batches", "updates.mini_batches=2", "optim.lr=1e-3"]


def test_clip_cov_and_ref_sync_resume_exactly(small, tmp_path):
    args = small + CLIP_COV_REF_SYNC
    full = rows_of(run(args, tmp_path / "full").run_dir)
    assert [r["ref_sync/syncs"] for r in full[1:]] == [0, 1, 2, 2]     # every 3 of 2 optimizer steps a rollout
    # clip_cov acts in the run (so the resume below replays its draws); not in every rollout: a
    # rollout whose covariance band holds no token is kernel-dependent (ATEN_CPU_CAPABILITY=default)
    assert any(r["clip_cov/frac"] > 0 for r in full[1:])
    run([*args, "steps=2"], tmp_path / "part")
    run(args + ["resume=true"], tmp_path / "part")
    assert rows_of(tmp_path / "part") == full


def test_diagnostics_do_not_change_clip_covs_draws(small, tmp_path):
    args = small + ["steps=2"] + CLIP_COV_REF_SYNC
    plain = rows_of(run(args, tmp_path / "plain").run_dir)
    diagnosed = rows_of(run(args + ["diag.grad_conflict=true", "diag.every=1"], tmp_path / "diag").run_dir)
    assert [r.get("loss") for r in plain] == [r.get("loss") for r in diagnosed]
    assert any("grad_norm/policy" in r for r in diagnosed)


# ------------------------------------------------------------------ GMPO against verl's conventions
def verl_geo_mean(logp, old, adv, mask, eps_low=0.4, eps_high=0.4, is_weights=None, mean="geometric"):
    """verl 0.9.1 core_algos.compute_policy_loss_geo_mean, written out sequence by sequence with
    float64 torch ops (so that it has a gradient): torch.mean over ALL B rows of -A_i rho_i, times
    the per-sequence geometric mean exp(mean_t log(w_t + 1e-10)) of token-level IS weights
    (mean="arithmetic": their plain mean over the sequence's tokens, the other convention)."""
    rows = []
    for i in range(logp.shape[0]):
        m, d, a = mask[i], logp[i] - old[i], adv[i].expand_as(logp[i])
        n = m.sum()
        s = torch.sign(a)
        pessimistic = s * torch.minimum(s * d, s * d.clamp(-eps_low, eps_high))
        loss = -((a * m).sum() / (n + 1e-8)) * torch.exp((pessimistic * m).sum() / (n + 1e-8))
        if is_weights is not None and mean == "geometric":
            loss = loss * torch.exp((torch.log(is_weights[i] + 1e-10) * m).sum() / (n + 1e-8))
        elif is_weights is not None:
            loss = loss * (is_weights[i] * m).sum() / n.clamp(min=1)
        rows.append(loss)
    return torch.stack(rows).mean()


def gmpo_case(seed=0, n=6, t=5):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(n, t, generator=g, dtype=D) < 0.8).to(D)
    mask[2] = 0.0                                                    # a fully masked row (overlong filter)
    mask[:, 0] = torch.where(torch.arange(n) == 2, 0.0, 1.0).to(D)    # every other row has a token
    old = -torch.rand(n, t, generator=g, dtype=D) * 3
    logp = (old + 0.3 * torch.randn(n, t, generator=g, dtype=D)).requires_grad_()
    adv = torch.randn(n, 1, generator=g, dtype=D)
    weights = torch.exp(0.4 * torch.randn(n, t, generator=g, dtype=D)) * mask
    return logp, old, adv, mask, weights


def ours(overrides, logp, old, adv, mask, weights=None):
    """The update's policy term for clip=gmpo, aggregated by loss_agg=seq_mean_token_mean."""
    terms, _ = LossTerms(tricks_of(["clip=gmpo", *overrides]))(
        logp, torch.zeros_like(logp), None, LossInputs(mask, adv, old_logp=old, is_weights=weights), NO_TERMS)
    return aggregate(terms["policy"], seq_mean_token_mean_weights(mask, None))


def value_and_grad(loss, logp):
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def test_gmpo_with_a_fully_masked_row_averages_over_all_rows_as_verl_does():
    logp, old, adv, mask, _ = gmpo_case()
    reference = value_and_grad(verl_geo_mean(logp, old, adv, mask), logp)
    got = value_and_grad(ours([], logp, old, adv, mask), logp)                  # mean_over=all (default)
    torch.testing.assert_close(got, reference, rtol=1e-12, atol=1e-14)
    # the documented alternative, mean_over=live: over the 5 non-empty rows, B / B_live = 6/5 larger
    live = value_and_grad(ours(["clip.mean_over=live"], logp, old, adv, mask), logp)
    torch.testing.assert_close(live, tuple(x * 6 / 5 for x in reference), rtol=1e-12, atol=1e-14)


def test_gmpo_takes_token_level_is_weights_as_their_geometric_mean_as_verl_does():
    logp, old, adv, mask, weights = gmpo_case(seed=1)
    reference = value_and_grad(verl_geo_mean(logp, old, adv, mask, is_weights=weights), logp)
    got = value_and_grad(ours([], logp, old, adv, mask, weights), logp)          # is_weights=geometric
    torch.testing.assert_close(got, reference, rtol=1e-12, atol=1e-14)
    # the documented alternative, is_weights=token: each token's loss times its own weight, i.e.
    # the sequence's loss times the arithmetic mean of its weights
    as_tokens = value_and_grad(ours(["clip.is_weights=token"], logp, old, adv, mask, weights), logp)
    arithmetic = value_and_grad(verl_geo_mean(logp, old, adv, mask, is_weights=weights, mean="arithmetic"), logp)
    torch.testing.assert_close(as_tokens, arithmetic, rtol=1e-12, atol=1e-14)
    assert not torch.allclose(as_tokens[0], reference[0])         # the two conventions differ here
