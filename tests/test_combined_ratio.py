"""The combined-ratio corrections of asynchronous GRPO without pi_old (rollout_correction=combined_truncate,
combined_mask; TRL issue #6945, PR #7120 at c48ed94a): PPO clip on rho = pi_theta / mu, each token's loss
times the gate clamp(rho, low, high) / rho (truncate) or 1[low <= rho <= high] (mask), detached. Why no
composition of the existing proximal and rollout_correction options is it, and the split over
micro-batches and ranks. Hand vectors in float64, worked from TRL AsyncGRPO's `compute_loss`
(trl/experimental/async_grpo/async_grpo_trainer.py at f2cd57710: coef_1 = exp(log_probs - old_log_probs),
-min(coef_1 A, clamp(coef_1, 1 - 0.2, 1 + 0.2) A), vLLM's log-probs as old_log_probs) and the PR's gate."""
import json

import pytest
import torch

from conftest import cli_here
from grpo_ablate.config.compose import compose
from grpo_ablate.config.inert import inert_reason
from grpo_ablate.config.spec import run_spec
from grpo_ablate.train.distributed import DataParallel
from grpo_ablate.train.losses import Coefficients, LossInputs, LossTerms
from grpo_ablate.tricks import option
from test_faults import refused

D = torch.float64
NO_TERMS = Coefficients(kl=0.0, kl_prev=0.0, entropy=0.0, value=0.0)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=D)
ADV = torch.tensor([[1.0], [-2.0]], dtype=D)
THETA = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]], dtype=D)   # log pi_theta (= pi_old: one step)
# rho = pi_theta / mu per token (the last is padding): 4 lies above the cap 3 and outside PPO's band for
# either sign of A; 1.1 inside both; 0.3 and 0.5 below PPO's 0.8
RHO = [[4.0, 1.1, 0.3], [4.0, 0.5, 1.0]]
MU = THETA - torch.tensor(RHO, dtype=D).log()
A = [1.0, -2.0]
PPO_LOW, PPO_HIGH = 0.8, 1.2


def trl_async_token(rho: float, a: float, gate: float) -> tuple[float, float]:
    """(loss, d loss / d log pi) of one token: TRL AsyncGRPO's PPO clip on the combined ratio, times the
    detached gate. The min takes the unclipped branch unless the clamp is the smaller; d rho / d log pi = rho."""
    unclipped, clipped = rho * a, min(max(rho, PPO_LOW), PPO_HIGH) * a
    loss = -gate * min(unclipped, clipped)
    grad = -gate * rho * a if unclipped <= clipped else 0.0
    return loss, grad


def expected(gates) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-token loss and gradient of the hand vector under per-token gates (0 on padding)."""
    pairs = [[trl_async_token(RHO[i][t], A[i], gates[i][t]) if MASK[i, t] else (0.0, 0.0) for t in range(3)]
             for i in range(2)]
    return (torch.tensor([[p[0] for p in row] for row in pairs], dtype=D),
            torch.tensor([[p[1] for p in row] for row in pairs], dtype=D))


def policy_term(overrides, old_logp=THETA, is_weights=None, sampler_logp=MU, advantages=ADV):
    """The policy term [N, T] through the trainer's LossTerms, its statistics, and the gradient of its masked sum."""
    logp = THETA.clone().requires_grad_(True)
    terms, stats = LossTerms(run_spec(compose(["dual_clip=none", *overrides])).tricks)(
        logp, torch.zeros_like(logp), None,
        LossInputs(MASK, advantages, old_logp=old_logp, sampler_logp=sampler_logp, is_weights=is_weights), NO_TERMS)
    (terms["policy"] * MASK).sum().backward()
    return terms["policy"].detach() * MASK, stats, logp.grad


def test_the_gates_on_the_combined_ratio_are_the_prs():
    gate = option("rollout_correction", "combined_truncate").impl
    g, stats = gate(THETA, MU, MASK, high=3.0)
    # clamp(rho, max=3) / rho: 3/4 above the cap, exactly 1 in range (computed in log space)
    torch.testing.assert_close(g, torch.tensor([[0.75, 1.0, 1.0], [0.75, 1.0, 0.0]], dtype=D), rtol=0, atol=1e-15)
    assert stats["rollout_corr/truncated_frac"].tolist() == [[1, 0, 0], [1, 0, 0]]
    g, _ = gate(THETA, MU, MASK, high=3.0, low=0.5)           # a lower bound lifts 0.3 to 0.5: 0.5 / 0.3
    torch.testing.assert_close(g[0], torch.tensor([0.75, 1.0, 0.5 / 0.3], dtype=D), rtol=0, atol=1e-14)
    mask = option("rollout_correction", "combined_mask").impl
    g, stats = mask(THETA, MU, MASK, high=3.0)
    assert g.tolist() == [[0, 1, 1], [0, 1, 0]] and stats["rollout_corr/masked_frac"].tolist() == [[1, 0, 0], [1, 0, 0]]
    assert mask(THETA, MU, MASK, high=3.0, low=0.5)[0].tolist() == [[0, 1, 0], [0, 1, 0]]   # 0.5 itself is kept
    # level=sequence: the product 4 * 1.1 * 0.3 = 1.32 and 4 * 0.5 = 2 (the padding's 1 left out)
    assert mask(THETA, MU, MASK, high=3.0, level="sequence")[0].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert mask(THETA, MU, MASK, high=1.5, level="sequence")[0].tolist() == [[1, 1, 1], [0, 0, 0]]


@pytest.mark.parametrize("proximal", ["recompute", "behaviour"])
def test_truncate_is_trls_async_loss_times_the_gate_value_and_gradient(proximal):
    # recompute hands the loss pi_old (= pi_theta at one step), behaviour hands it mu: the option takes the policy
    # loss's ratio against mu either way, so both give the PR's loss
    old = THETA if proximal == "recompute" else MU
    loss, stats, grad = policy_term([f"proximal={proximal}", "rollout_correction=combined_truncate"], old_logp=old)
    want_loss, want_grad = expected([[0.75, 1.0, 1.0], [0.75, 1.0, 0.0]])
    torch.testing.assert_close(loss, want_loss, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=1e-12)
    # the effective weights the PR names: clamp(rho, max=3) A on the unclipped branch (6 = 3 * 2 where rho = 4,
    # A < 0: the branch that grows linearly in rho without the gate), 0 where PPO's clip binds
    torch.testing.assert_close(grad, torch.tensor([[0.0, -1.1, -0.3], [6.0, 0.0, 0.0]], dtype=D), rtol=0, atol=1e-12)
    assert stats["clip/high_frac"].tolist()[0][0] == 1 and stats["clip/low_frac"].tolist()[1][1] == 1


def test_mask_is_trls_async_loss_times_the_band_value_and_gradient():
    loss, stats, grad = policy_term(["rollout_correction=combined_mask"])
    want_loss, want_grad = expected([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    torch.testing.assert_close(loss, want_loss, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=1e-12)
    assert stats["rollout_corr/masked_frac"].tolist() == [[1, 0, 0], [1, 0, 0]]


def test_no_composition_of_the_existing_options_is_the_combined_correction():
    """The issue asks for a named trick over staleness, proximal and rollout_correction if the correction is
    expressible there. It is not: every existing option's weights are pi_old / mu, once per rollout."""
    want_loss, want_grad = expected([[0.75, 1.0, 1.0], [0.75, 1.0, 0.0]])
    ages = torch.ones(2, 1, dtype=D)
    # proximal=behaviour makes the PPO ratio the combined one (pi_old := mu), but TIS then reads mu / mu = 1
    old = option("proximal", "behaviour").impl(THETA, MU, ages, MASK)[0]
    weights = option("rollout_correction", "token_truncate").impl(old, MU, MASK, high=3.0)[0]
    assert torch.equal(weights, MASK)
    loss, _, grad = policy_term(["proximal=behaviour", "rollout_correction=token_truncate"], old_logp=old,
                                is_weights=weights)
    torch.testing.assert_close(grad, expected([[1.0] * 3, [1.0] * 3])[1], rtol=0, atol=1e-12)   # ungated PPO
    assert grad[1, 0].item() == pytest.approx(8.0) and want_grad[1, 0].item() == pytest.approx(6.0)
    # pi_old recomputed: TIS's clamp(pi_old / mu) is the gate's effective weight on the first step, but the PPO
    # ratio is pi_theta / pi_old = 1, so where PPO's clip binds on pi_theta / mu the tokens still move
    weights = option("rollout_correction", "token_truncate").impl(THETA, MU, MASK, high=3.0)[0]
    loss, _, grad = policy_term(["rollout_correction=token_truncate"], is_weights=weights)
    same = torch.tensor([[0, 1, 1], [1, 0, 0]], dtype=torch.bool)          # PPO's clip does not bind on rho
    torch.testing.assert_close(grad[same], want_grad[same], rtol=0, atol=1e-12)
    torch.testing.assert_close(loss[same], want_loss[same], rtol=0, atol=1e-12)
    assert grad[0, 0].item() == pytest.approx(-3.0) and grad[1, 1].item() == pytest.approx(1.0)   # the PR: 0, 0
    assert want_grad[0, 0] == 0 and want_grad[1, 1] == 0


def test_an_unknown_sampler_log_prob_is_ratio_one_and_no_sampler_leaves_the_plain_loss():
    sampler = MU.clone()
    sampler[0, 0] = float("nan")                    # unknown (tricks/behaviour.py): rho = 1, gate 1, PPO's ratio 1
    g, _ = option("rollout_correction", "combined_truncate").impl(THETA, sampler, MASK)
    assert g[0, 0].item() == 1.0
    loss, _, _ = policy_term(["rollout_correction=combined_truncate"], sampler_logp=sampler)
    assert loss[0, 0].item() == pytest.approx(-1.0)
    # nothing recorded (greedy sampling): no gate and the ratio against pi_old, the plain PPO loss
    loss, stats, _ = policy_term(["rollout_correction=combined_truncate"], sampler_logp=None)
    torch.testing.assert_close(loss, -ADV.expand(2, 3) * MASK, rtol=0, atol=1e-15)
    assert not any(name.startswith("rollout_corr/") for name in stats)


def test_the_gate_is_row_local_so_micro_batches_and_ranks_add_up_to_the_whole_batch():
    """Each token's gate and statistics read only its own row (a token, or its sequence): the rows a rank
    (DataParallel.share) or a micro-batch holds give the whole batch's. The trainer-level proofs: a real
    float64 step in 1, 2, 3 or 8 micro-batches (tests/test_micro_batches.py, every option of the family) and
    two torchrun ranks against one process (tests/test_distributed.py, slow)."""
    torch.manual_seed(0)
    theta = torch.randn(7, 5, dtype=D) - 1.0
    mu = theta + 0.8 * torch.randn(7, 5, dtype=D)
    mask = (torch.rand(7, 5) > 0.3).to(D)
    for name, knobs in (("combined_truncate", {"low": 0.5}), ("combined_mask", {"level": "sequence", "high": 2.0}),
                        ("combined_mask", {"low": 0.5})):
        gate = option("rollout_correction", name).bind(knobs)
        whole, whole_stats = gate(theta, mu, mask)
        for world in (2, 3):
            parts = [gate(theta[share], mu[share], mask[share]) for share in shares(7, world)]
            torch.testing.assert_close(torch.cat([p[0] for p in parts]), whole, rtol=0, atol=0)
            for key, value in whole_stats.items():
                torch.testing.assert_close(torch.cat([p[1][key] for p in parts]), value, rtol=0, atol=0)


def shares(n: int, world: int) -> list[slice]:
    """Each rank's rows, as DataParallel.share splits them."""
    out = []
    for rank in range(world):
        dp = DataParallel.__new__(DataParallel)
        dp.world, dp.rank = world, rank
        out.append(dp.share(n))
    return out


def test_inert_without_a_ratio_off_the_sampler_and_it_moves_the_ppo_ratio_off_one():
    for name in ("combined_truncate", "combined_mask"):
        assert "pi_theta / mu ≡ 1" in inert_reason(compose([f"rollout_correction={name}"]), "rollout_correction", name)
        for acts in (["staleness=fixed"], ["rollout.dtype=bfloat16"], ["updates.mini_batches=4"]):
            assert inert_reason(compose([f"rollout_correction={name}", *acts]), "rollout_correction", name) is None
    # one step of stale rollouts: PPO's clip acts on pi_theta / mu, so clip=symmetric is not inert with the option
    stale = ["staleness=fixed"]
    assert inert_reason(compose(stale), "clip", "symmetric") is not None
    assert inert_reason(compose([*stale, "+trick=combined_ratio_truncate"]), "clip", "symmetric") is None


@pytest.mark.parametrize("proximal", ["loglinear", "train_logp"])
def test_an_approximated_proximal_policy_is_refused_in_one_line(proximal, tmp_path):
    refused(cli_here("train", "rollout_correction=combined_mask", f"proximal={proximal}", cwd=tmp_path),
            f"proximal={proximal}'s pi_prox would reach only the KL term")


def test_grpo_ablate_tricks_lists_both_with_source_claim_and_activity(tmp_path):
    out = cli_here("tricks", "--format", "json", cwd=tmp_path)
    assert out.exit_code == 0, out.stderr
    listed = {t["name"]: t for t in json.loads(out.stdout)}
    for trick, metric in (("combined_ratio_truncate", "truncated_frac"), ("combined_ratio_mask", "masked_frac")):
        assert "PR #7120" in listed[trick]["source"] and listed[trick]["claims"][0]["effect"] == "helps"
        assert listed[trick]["activity"].startswith(f"rollout_corr/{metric}")


def test_the_named_tricks_select_the_options():
    for trick, name in (("combined_ratio_truncate", "combined_truncate"), ("combined_ratio_mask", "combined_mask")):
        cfg = compose([f"+trick={trick}"])
        # TRL's synchronous defaults, which the PR keeps: clip_max 3, no clip_min
        chosen = cfg.rollout_correction
        assert (chosen.name, chosen.high, chosen.low) == (name, 3.0, None)
        assert option("rollout_correction", name).tricks[0].source.startswith("TRL PR #7120")
