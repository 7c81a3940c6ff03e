"""LOCAL, the local-curvature logit regression (clip=local; verl-project/verl 38d50c4a,
verl/trainer/ppo/local_logit_regression.py and its tests tests/trainer/ppo/test_local_logit_regression*.py):
the sampled token's logit centred on pi_old's top-K, regressed onto eta * A. Hand vectors in float64,
worked from verl's `compute_old_topk_features`, `compute_topk_centered_logits` and
`compute_policy_loss_local`; the loss through the trainer's LossTerms; a real step in float64."""
import copy
import math

import pytest
import torch

from conftest import cli_here
from grpo_ablate.config.compose import compose
from grpo_ablate.config.inert import inert_reason
from grpo_ablate.config.spec import run_spec
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.train.losses import Coefficients, LossInputs, LossTerms
from grpo_ablate.tricks import option
from grpo_ablate.tricks.clip.local import EMBEDDED_VOCABULARY, centred_logprob, local_loss, old_topk_support
from grpo_ablate.tricks.loss_agg import aggregate
from test_faults import refused
from test_micro_batches import SPLITS, assert_split_invariant, float64_trainer, one_step

D = torch.float64
NO_TERMS = Coefficients(kl=0.0, kl_prev=0.0, entropy=0.0, value=0.0)
# one state, a vocabulary of 4: pi_old's logits, the sampled token a = 2 (outside pi_old's top-2 {0, 1})
Z_OLD = torch.tensor([2.0, 1.0, 0.0, -1.0], dtype=D)
STEP = torch.tensor([0.1, -0.2, 0.3, 0.0], dtype=D)   # z_theta = z_old + STEP
A_TOKEN = torch.tensor(2)
PBAR = [math.e / (1 + math.e), 1 / (1 + math.e)]      # pi_old renormalised on {0, 1}: softmax([2, 1])


def test_the_support_is_pi_olds_top_k_renormalised_and_psi_is_the_centred_logit():
    ids, pbar, mass = old_topk_support(torch.log_softmax(Z_OLD, -1), 2)
    assert ids.tolist() == [0, 1]
    torch.testing.assert_close(pbar, torch.tensor(PBAR, dtype=D), rtol=0, atol=1e-15)
    torch.testing.assert_close(mass, torch.softmax(Z_OLD, -1)[:2].sum(), rtol=0, atol=1e-15)   # 0.8808
    # psi = z(a) - sum pbar z = 0 - (0.7311 * 2 + 0.2689 * 1), from the log-probs: the log-partition cancels
    psi = centred_logprob(torch.log_softmax(Z_OLD, -1), A_TOKEN, ids, pbar)
    assert psi.item() == pytest.approx(-1.7310585786300048, abs=1e-14)
    # the same with the logits themselves (verl centres the logits) and with any constant added to them
    assert centred_logprob(Z_OLD + 7.5, A_TOKEN, ids, pbar).item() == pytest.approx(psi.item(), abs=1e-14)


def test_with_the_whole_vocabulary_the_centre_is_the_mean_logit_under_pi_old():
    """verl's test_full_support_gives_the_exact_optimal_offset: K >= |V| (clipped) -> psi = z(a) - E_pi[z]."""
    log_probs = torch.log_softmax(Z_OLD, -1)
    ids, pbar, mass = old_topk_support(log_probs, 100)
    assert ids.shape == (4,) and mass.item() == pytest.approx(1.0, abs=1e-15)
    assert centred_logprob(log_probs, A_TOKEN, ids, pbar).item() == pytest.approx(-1.4926527345857699, abs=1e-14)


def test_the_loss_and_its_logit_gradient_are_delta_times_the_centred_indicator():
    """verl's test_logit_gradient_is_residual_times_centred_indicator, by hand: eta = 2, A = 0.5,
    psi_old = -1.73106, psi_theta = 0.3 - (0.7311 * 2.1 + 0.2689 * 0.8) = -1.45038,
    delta = 0.28068 - 1 = -0.71932, loss = delta^2 / 2 = 0.25871, d loss / dz = delta (e_a - pbar)."""
    ids, pbar, _ = old_topk_support(torch.log_softmax(Z_OLD, -1), 2)
    psi_old = centred_logprob(torch.log_softmax(Z_OLD, -1), A_TOKEN, ids, pbar)
    z = (Z_OLD + STEP).requires_grad_(True)
    psi = centred_logprob(torch.log_softmax(z, -1), A_TOKEN, ids, pbar)
    assert psi.item() == pytest.approx(-1.4503761522190064, abs=1e-14)
    loss, stats = local_loss(psi.view(1, 1), psi_old.view(1, 1), torch.tensor([[0.5]], dtype=D),
                             torch.ones(1, 1, dtype=D), eta=2.0)
    assert loss.item() == pytest.approx(0.25870888583698437, abs=1e-14)
    assert stats["local/residual_sq"].item() == pytest.approx(2 * 0.25870888583698437, abs=1e-14)
    assert stats["local/feature_delta_abs"].item() == pytest.approx(0.2806824264109984, abs=1e-14)
    assert stats["local/target_abs"].item() == 1.0
    loss.sum().backward()
    expected = [0.5258632829315595, 0.19345429065744216, -0.7193175735890016, 0.0]   # delta * (e_a - pbar)
    torch.testing.assert_close(z.grad, torch.tensor(expected, dtype=D), rtol=0, atol=1e-14)


def test_at_pi_old_the_gradient_is_the_policy_gradients_with_pi_replaced_by_pbar():
    """delta = -eta A at theta = theta_old: -eta A (e_a - pbar); with the whole vocabulary pbar = pi,
    and at eta = 1 that is -A (e_a - pi), the gradient of -A log pi(a) (the default loss at rho = 1)."""
    for k, eta in ((2, 1.5), (4, 1.0)):
        log_probs_old = torch.log_softmax(Z_OLD, -1)
        ids, pbar, _ = old_topk_support(log_probs_old, k)
        z = Z_OLD.clone().requires_grad_(True)
        psi = centred_logprob(torch.log_softmax(z, -1), A_TOKEN, ids, pbar)
        advantage = torch.tensor([[0.8]], dtype=D)
        local_loss(psi.view(1, 1), psi.detach().view(1, 1), advantage, torch.ones(1, 1, dtype=D),
                   eta=eta)[0].sum().backward()
        full_pbar = torch.zeros(4, dtype=D).scatter(0, ids, pbar)
        torch.testing.assert_close(z.grad, -eta * 0.8 * (torch.nn.functional.one_hot(A_TOKEN, 4) - full_pbar),
                                   rtol=0, atol=1e-14)
    pg = Z_OLD.clone().requires_grad_(True)
    (-0.8 * torch.log_softmax(pg, -1)[2]).backward()
    torch.testing.assert_close(z.grad, pg.grad, rtol=0, atol=1e-14)   # the last: K = |V|, eta = 1


def test_a_token_outside_the_scored_kept_set_gets_no_weight_and_no_nan():
    """Under rollout.sampling_replay the scored log-probs are -inf outside the sampler's kept set: a
    top-K larger than the kept set gives those tokens pbar 0 (and 0, not NaN, in psi and its gradient)."""
    z = Z_OLD.clone().requires_grad_(True)
    log_probs = torch.log_softmax(z, -1)
    kept = torch.tensor([True, True, True, False])
    scored = (log_probs - torch.logsumexp(log_probs[kept], -1)).masked_fill(~kept, float("-inf"))
    ids, pbar, _ = old_topk_support(scored.detach(), 4)
    assert pbar[ids == 3].item() == 0.0
    psi = centred_logprob(scored, A_TOKEN, ids, pbar)
    psi.backward()
    assert torch.isfinite(psi) and torch.isfinite(z.grad).all()
    three = torch.softmax(Z_OLD[:3], -1)   # pbar on the kept set: pi renormalised over it
    assert psi.item() == pytest.approx((Z_OLD[2] - (three * Z_OLD[:3]).sum()).item(), abs=1e-14)


def test_verls_hand_cases_through_the_trainers_loss():
    """verl's test_loss_at_the_old_policy_is_half_eta_squared_mean_advantage_squared and
    test_rollout_weights_and_metrics, through LossTerms (psi handed as the policy loss's input) and
    loss_agg=token_mean (verl's token-mean)."""
    terms = LossTerms(run_spec(compose(["clip=local", "clip.eta=0.5", "loss_agg=token_mean"])).tricks)
    weigh = option("loss_agg", "token_mean").impl
    advantages = torch.tensor([[1.0, -2.0, 0.5], [3.0, 0.0, 0.0]], dtype=D)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=D)
    zeros = torch.zeros_like(advantages)
    out, stats = terms(zeros, zeros, None, LossInputs(mask, advantages, old_centred=zeros), NO_TERMS, centred=zeros)
    mean_square = (1.0 + 4.0 + 0.25 + 9.0) / 4
    assert aggregate(out["policy"], weigh(mask, 3, None)).item() == pytest.approx(0.5 * 0.25 * mean_square, abs=1e-15)
    # rollout IS weights multiply the per-token loss: (2 * 0.5 * 0.8^2 + 0) / 2 tokens
    terms = LossTerms(run_spec(compose(["clip=local", "loss_agg=token_mean"])).tricks)
    centred = torch.tensor([[0.2, 0.4]], dtype=D, requires_grad=True)
    inputs = LossInputs(torch.ones(1, 2, dtype=D), torch.ones(1, 2, dtype=D), old_centred=torch.zeros(1, 2, dtype=D),
                        is_weights=torch.tensor([[2.0, 0.0]], dtype=D))
    out, _ = terms(torch.zeros(1, 2, dtype=D), torch.zeros(1, 2, dtype=D), None, inputs, NO_TERMS, centred=centred)
    loss = aggregate(out["policy"], weigh(inputs.mask, 2, None))
    assert loss.item() == pytest.approx(2.0 * 0.5 * 0.8 ** 2 / 2, abs=1e-15)
    loss.backward()   # d/dpsi: w * delta / 2 tokens = [2 * (0.2 - 1) / 2, 0]
    torch.testing.assert_close(centred.grad, torch.tensor([[-0.8, 0.0]], dtype=D), rtol=0, atol=1e-15)


def test_without_pi_olds_forward_the_update_centres_on_its_own_detached_support():
    """One optimizer step: pi_old is the policy, psi_old = psi_theta detached, the residual -eta A."""
    terms = LossTerms(run_spec(compose(["clip=local", "clip.eta=2"])).tricks)
    centred = torch.tensor([[0.3, -0.1]], dtype=D, requires_grad=True)
    advantages, mask = torch.tensor([[0.5]], dtype=D), torch.ones(1, 2, dtype=D)
    out, stats = terms(torch.zeros(1, 2, dtype=D), torch.zeros(1, 2, dtype=D), None, LossInputs(mask, advantages),
                       NO_TERMS, centred=centred)
    torch.testing.assert_close(out["policy"], torch.full((1, 2), 0.5, dtype=D))   # (2 * 0.5)^2 / 2
    assert stats["local/feature_delta_abs"].abs().sum() == 0
    with pytest.raises(ValueError, match="centred log-probs"):
        terms(centred, centred, None, LossInputs(mask, advantages), NO_TERMS)


def test_the_embedded_vocabulary_is_what_the_inert_rule_reads():
    from grpo_ablate.models import build_char_tokenizer
    from grpo_ablate.tasks.arithmetic import ArithmeticTask

    assert len(build_char_tokenizer(ArithmeticTask.chars)) == EMBEDDED_VOCABULARY


def test_the_inert_rule_and_its_fixes():
    assert "policy gradient" in inert_reason(compose(["clip=local"]), "clip", "local")
    for fix in (["clip.topk=4"], ["clip.eta=2"], ["updates=mini_batches"], ["model=hf", "model.path=/x"]):
        assert inert_reason(compose(["clip=local", *fix]), "clip", "local") is None, fix
    flags = option("clip", "local")
    assert flags.centres_on_old_topk and not flags.off_policy_only
    assert option("clip", "local").config() == {"name": "local", "eta": 1.0, "topk": 64}
    assert "topk" not in option("clip", "symmetric").config()


@pytest.mark.parametrize("overrides, needle", [
    (["proximal=behaviour"], "proximal=behaviour puts another policy in its place"),
    (["diag.grad_conflict=true"], "use diag.grad_conflict=false"),
    (["clip.topk=0"], "clip.topk=0 is not allowed; it must be an integer > 0"),
    (["clip.eta=0"], "clip.eta=0 is not allowed"),
])
def test_what_local_cannot_run_with_is_refused_in_one_line(overrides, needle, tmp_path):
    with pytest.raises(ConfigError):
        validate(compose(["clip=local", *overrides]))
    refused(cli_here("train", "clip=local", *overrides, cwd=tmp_path), needle)


def test_on_the_embedded_model_at_one_step_the_default_local_is_the_policy_gradient(cache_dir):
    """A real step in float64: clip=local (K = 64 >= the 17-token vocabulary, eta = 1) moves every
    weight as the default loss does at rho = 1 (the inert rule); K = 4 does not; both split-invariant."""
    grads = {}
    for name, overrides in (("default", []), ("local", ["clip=local"]), ("local_k4", ["clip=local", "clip.topk=4"])):
        trainer = float64_trainer(["updates=single", "loss_agg=token_mean", *overrides], cache_dir)
        start = (copy.deepcopy(trainer.model.state_dict()), copy.deepcopy(trainer.state_dict()), trainer.spec)
        metrics, grads[name] = one_step(trainer, start)
        if name == "local_k4":
            assert metrics["local/residual_sq"] > 0 and metrics["local/feature_delta_abs"] == 0
            assert 0 < metrics["clip/topk_mass"] < 1   # 4 of 17 tokens
        if name == "local":
            assert metrics["clip/topk_mass"] == pytest.approx(1.0, abs=1e-12)   # K = 64: the whole vocabulary
            assert_split_invariant(trainer, SPLITS)   # the support of each micro-batch's own forward
    for a, b in zip(grads["default"], grads["local"]):
        assert (a - b).norm() <= 1e-10 * b.norm() + 1e-14
    assert sum((a - b).norm() for a, b in zip(grads["default"], grads["local_k4"])) > 1e-6
