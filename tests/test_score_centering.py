"""score_centering (arXiv 2609.20807): the centering term against hand vectors in float64, its
gradient, its composition with rollout_correction's per-token rules, the sampler's top-k head on
both engines, and the loss it adds in a real step (split over micro-batches and ranks)."""
import math
from types import SimpleNamespace

import pytest
import torch

from conftest import refused_train
from grpo_ablate.config.compose import compose
from grpo_ablate.config.spec import run_spec
from grpo_ablate.config.validate import validate
from grpo_ablate.rundir.files import read_rows
from grpo_ablate.sampling.decode import concat_rollouts, generate, select_rows
from grpo_ablate.sampling.vllm import _as_rollout
from grpo_ablate.train.grpo import train
from grpo_ablate.train.losses import Coefficients, LossInputs, LossTerms
from grpo_ablate.tricks.registry import option
from grpo_ablate.tricks.score_centering import score_centering_term, weight_rule

# The hand case: a vocabulary of 4, the trainer p = (.5, .2, .2, .1) (logits log p), the sampler's
# head H = {0, 1} with q = (.45, .35): p_H = .7, q_H = .8, rho = (1 - .8) / (1 - .7) = 2/3.
P = [0.5, 0.2, 0.2, 0.1]
Q_HEAD = [0.45, 0.35]


def rule(name, **knobs):
    """rollout_correction=<name>'s per-token weight rule, as the loss builds it (None: no correction)."""
    chosen = option("rollout_correction", name)
    return weight_rule(chosen.bind(knobs) if chosen.weighs_each_token else None)


def hand_case(weight):
    """(c, dc/dlogits) of the hand case under a weight rule, float64."""
    logits = torch.tensor(P, dtype=torch.float64).log().requires_grad_()
    head_logp = torch.log_softmax(logits, dim=-1)[:2].view(1, 1, 2)
    sampler = torch.tensor(Q_HEAD, dtype=torch.float64).log().view(1, 1, 2)
    c, stats = score_centering_term(head_logp, sampler, torch.ones(1, 1, dtype=torch.float64), weight=weight)
    c.sum().backward()
    return c.item(), logits.grad.tolist(), stats


# By hand, r_a = q_a w(p_a/q_a) - alpha p_a with alpha = rho w(1/rho); c = sum_H r_a log p_a;
# dc/dz_j = r_j 1[j in H] - p_j sum_H r.
HAND = [
    # no correction, w = 1: alpha = 2/3, r = (.45 - 1/3, .35 - 2/15) = (7/60, 13/60), sum r = 1/3
    (("none", {}), 7 / 60 * math.log(0.5) + 13 / 60 * math.log(0.2), [-0.05, 0.15, -0.2 / 3, -0.1 / 3], 2 / 3),
    # TIS at 1.2: w(1/rho = 1.5) = 1.2, alpha = .8; the head ratios (1.11, .571) pass: r = (.1, .04), sum .14
    (("token_truncate", {"high": 1.2}), 0.1 * math.log(0.5) + 0.04 * math.log(0.2), [0.03, 0.012, -0.028, -0.014],
     0.8),
    # IcePop [.6, 5]: id 1's ratio .571 is outside (w 0), the tail's 1.5 inside: alpha = 1, r = (0, -.2)
    (("token_mask", {"low": 0.6, "high": 5.0}), -0.2 * math.log(0.2), [0.1, -0.16, 0.04, 0.02], 1.0),
    # untruncated weights p/q (TIS far above every ratio): the centred score is exactly 0 (sum_v p s = 0)
    (("token_truncate", {"high": 100.0}), 0.0, [0.0, 0.0, 0.0, 0.0], 1.0),
]


@pytest.mark.parametrize("correction, value, grad, alpha", HAND, ids=["none", "tis", "icepop", "exact_is"])
def test_the_centering_term_and_its_gradient_match_the_hand_case(correction, value, grad, alpha):
    c, dc, stats = hand_case(rule(correction[0], **correction[1]))
    assert c == pytest.approx(value, abs=1e-12)
    assert dc == pytest.approx(grad, abs=1e-12)
    assert stats["score_centering/alpha"].item() == pytest.approx(alpha, abs=1e-12)
    assert stats["score_centering/sampler_head_mass"].item() == pytest.approx(0.8, abs=1e-12)
    assert stats["score_centering/train_head_mass"].item() == pytest.approx(0.7, abs=1e-12)


def test_with_the_whole_vocabulary_as_head_the_drift_is_gone():
    """A prefix whose completions all get the same advantage A (group centering leaves E_q[A] != 0
    there): REINFORCE's expected gradient under the sampler, -A sum_y q_y grad log p_y, is the drift;
    with the centering term it is exactly 0 (float64), for no weight and for TIS alike."""
    torch.manual_seed(0)
    logits = torch.randn(6, dtype=torch.float64, requires_grad=True)
    q = torch.softmax(torch.randn(6, dtype=torch.float64), dim=-1)
    A = 0.7
    for weight in (None, rule("token_truncate", high=2.0)):
        logp = torch.log_softmax(logits, dim=-1)
        ratio = (logp.detach() - q.log()).exp()
        w = torch.ones_like(ratio) if weight is None else weight(ratio.view(1, 1, 6)).view(6)
        drift = -A * (q * w * logp).sum()                           # E_q[-A w_y log p_y], its gradient the drift
        c, _ = score_centering_term(logp.view(1, 1, 6), q.log().view(1, 1, 6), torch.ones(1, 1, dtype=torch.float64),
                                    weight=weight)
        (grad_plain,) = torch.autograd.grad(drift, logits, retain_graph=True)
        (grad_centred,) = torch.autograd.grad(drift + A * c.sum(), logits)
        assert grad_plain.abs().max() > 1e-2
        assert grad_centred.abs().max() < 1e-12


@pytest.mark.parametrize("correction", [("none", {}), ("token_truncate", {}), ("token_mask", {})])
def test_a_sampler_that_is_the_trainer_adds_nothing(correction):
    """q = p on the head (the inert case: a float32 sampler on the HF engine): rho = 1, alpha = w(1) = 1,
    every residual 0, the term and its gradient 0, a tail or not."""
    logits = torch.randn(2, 3, 9, dtype=torch.float64, requires_grad=True)
    logp = torch.log_softmax(logits, dim=-1)
    for k in (4, 9):
        head = logp.topk(k, dim=-1).indices
        head_logp = logp.gather(-1, head)
        c, stats = score_centering_term(head_logp, head_logp.detach(), torch.ones(2, 3, dtype=torch.float64),
                                        weight=rule(correction[0], **correction[1]))
        (grad,) = torch.autograd.grad(c.sum(), logits, retain_graph=True)
        assert c.abs().max() < 1e-15 and grad.abs().max() < 1e-15
        assert stats["score_centering/residual_l1"].abs().max() < 1e-15


def test_untrained_tokens_and_undrawable_ids_add_nothing():
    """A masked token adds 0 (its statistics too); a head id the sampler could not draw (log q = -inf, a
    filtering sampler's) or the trainer scores -inf (the replayed kept set) adds 0 and no NaN."""
    logits = torch.randn(1, 2, 5, dtype=torch.float64, requires_grad=True)
    logp = torch.log_softmax(logits, dim=-1)
    head_logp = logp[..., :3].clone()
    head_logp[0, 0, 2] = float("-inf")
    sampler = torch.log_softmax(torch.randn(1, 2, 5, dtype=torch.float64), dim=-1)[..., :3].clone()
    sampler[0, 1, 2] = float("-inf")
    c, stats = score_centering_term(head_logp, sampler, torch.tensor([[1.0, 0.0]], dtype=torch.float64))
    c.sum().backward()
    assert torch.isfinite(c).all() and torch.isfinite(logits.grad).all()
    assert c[0, 1] == 0 and stats["score_centering/residual_l1"][0, 1] == 0


def test_none_adds_nothing_and_reads_no_head():
    c, stats = option("score_centering", "none").impl(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.ones(2, 3))
    assert torch.equal(c, torch.zeros(2, 3)) and stats == {}
    assert run_spec(compose([])).sampler_head() == 0
    assert run_spec(compose(["score_centering=top_k", "score_centering.k=5"])).sampler_head() == 5


def loss_terms(overrides):
    return LossTerms(run_spec(compose(overrides)).tricks)


def test_the_loss_adds_the_advantage_times_the_term_outside_the_importance_weight():
    """In the policy term: A * c, times the token masks but not rollout_correction's weight (w is inside
    c), so the policy loss with TIS is w_y * (PPO's term) + A * c."""
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    logp_all = torch.log_softmax(logits, dim=-1)
    head = logp_all.topk(3, dim=-1).indices
    logp, head_logp = logp_all[..., 0], logp_all.gather(-1, head)
    sampler_head = torch.log_softmax(logits.detach() + 0.3 * torch.randn(2, 3, 7, dtype=torch.float64),
                                     dim=-1).gather(-1, head)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float64)
    adv = torch.tensor([[0.5], [-1.5]], dtype=torch.float64)
    is_weights = torch.tensor([[1.2, 0.8, 0.0], [2.0, 1.0, 0.5]], dtype=torch.float64)
    inputs = LossInputs(mask, adv, old_logp=logp.detach(), is_weights=is_weights, sampler_head=sampler_head)
    coef = Coefficients()
    plain, _ = loss_terms(["rollout_correction=token_truncate"])(logp, torch.zeros_like(logp), None, inputs, coef)
    centred, stats = loss_terms(["rollout_correction=token_truncate", "score_centering=top_k"])(
        logp, torch.zeros_like(logp), None, inputs, coef, head_logp=head_logp)
    c, _ = score_centering_term(head_logp, sampler_head, mask, weight=rule("token_truncate"))
    assert torch.allclose(centred["policy"], plain["policy"] + adv * c, atol=1e-14, rtol=0)
    assert "score_centering/residual_l1" in stats
    with pytest.raises(RuntimeError, match="top-k head"):
        loss_terms(["score_centering=top_k"])(logp, torch.zeros_like(logp), None, inputs, coef)


# ------------------------------------------------------------------ the sampler's head, both engines
def tiny_policy():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=11, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    return Qwen2ForCausalLM(config).eval()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_hf_sampler_records_the_head_when_asked(dtype):
    """generate(head=k): each token's k most probable ids and their log-probs under the distribution it
    drew from (the sampled token's log-prob among them where it is in the head), -inf after EOS;
    without `head` (every run without score_centering) no head is recorded."""
    model = tiny_policy()
    kwargs = dict(num_samples=3, max_new_tokens=6, temperature=1.0, eos_id=2, pad_id=0, dtype=dtype)
    plain = generate(model, [[1, 4, 5], [1, 6]], generator=torch.Generator().manual_seed(3), **kwargs)
    roll = generate(model, [[1, 4, 5], [1, 6]], generator=torch.Generator().manual_seed(3), head=4, **kwargs)
    assert plain.head_ids is None and plain.head_logprobs is None
    assert torch.equal(plain.sequences, roll.sequences)          # recording the head draws nothing
    N, T = roll.completion_mask.shape
    assert roll.head_ids.shape == roll.head_logprobs.shape == (N, T, 4)
    live = roll.completion_mask > 0
    assert torch.isinf(roll.head_logprobs[~live]).all() and torch.isfinite(roll.head_logprobs[live]).all()
    assert (roll.head_logprobs[live].diff(dim=-1) <= 0).all()          # most probable first
    assert (roll.head_logprobs[live].exp().sum(-1) < 1).all()          # full-vocabulary mass: 4 of 11 ids
    sampled = roll.completion_ids.unsqueeze(-1) == roll.head_ids
    inside = sampled.any(-1) & live
    at = roll.head_logprobs.masked_fill(~sampled, 0).sum(-1)
    assert torch.allclose(at[inside], roll.sampler_logprobs[inside], atol=1e-5)
    # the fields travel with the rows: a selection and a concatenation keep them
    both = concat_rollouts([select_rows(roll, torch.tensor([0, 1])), select_rows(roll, torch.tensor([5]))], 0)
    assert torch.equal(both.head_ids[2], roll.head_ids[5]) and both.head_logprobs.shape[-1] == 4


def test_vllm_outputs_give_the_head_from_their_logprobs():
    """rollout=vllm asks SamplingParams(logprobs=k) when an option reads the head; the k largest returned
    log-probs are the head (vLLM adds the sampled token when it is outside them), -inf past a row's end."""
    entry = lambda lp: SimpleNamespace(logprob=lp)   # noqa: E731
    out_a = SimpleNamespace(token_ids=[7, 2], finish_reason="stop",
                            logprobs=[{7: entry(-0.1), 3: entry(-2.5), 9: entry(-3.0)},
                                      {5: entry(-0.4), 2: entry(-1.2), 6: entry(-4.0)}])
    out_b = SimpleNamespace(token_ids=[4], finish_reason="length",
                            logprobs=[{4: entry(-5.0), 1: entry(-0.3), 8: entry(-1.0)}])
    roll = _as_rollout([([1, 2], out_a), ([1], out_b)], pad_id=0, head=2)
    assert roll.head_ids.tolist() == [[[7, 3], [5, 2]], [[1, 8], [0, 0]]]
    assert roll.head_logprobs[0].tolist() == [pytest.approx([-0.1, -2.5]), pytest.approx([-0.4, -1.2])]
    assert roll.head_logprobs[1, 0].tolist() == pytest.approx([-0.3, -1.0])
    assert torch.isinf(roll.head_logprobs[1, 1]).all()
    assert _as_rollout([([1, 2], out_a)], pad_id=0).head_ids is None


# ------------------------------------------------------------------ config, end to end
def test_only_a_per_token_rollout_correction_composes(tmp_path):
    for ok in (["rollout_correction=token_truncate"], ["rollout_correction=token_mask"], []):
        validate(compose(["score_centering=top_k", *ok]))
    refused_train("score_centering=top_k rollout_correction=sequence_mask", "composes only with a per-token",
                  tmp_path)
    refused_train("score_centering=top_k rollout_correction=token_truncate rollout_correction.renormalize=true",
                  "renormalize", tmp_path)


def test_a_bf16_sampler_run_logs_the_centering(small, tmp_path):
    """A real run with a bf16 sampler: the head is recorded, the residual is above 0 (the sampler is not
    the trainer), the head masses are those of the small model's whole vocabulary (k = 32 covers it)."""
    args = small + ["steps=2", "rollout.dtype=bfloat16", "+trick=score_centering"]
    assert train(compose(args), tmp_path / "run", args).state == "completed"
    rows = [r for r in read_rows(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert all(r["score_centering/residual_l1"] > 0 for r in rows)
    assert all(r["score_centering/sampler_head_mass"] == pytest.approx(1.0, abs=1e-5) for r in rows)


@pytest.mark.slow
def test_two_ranks_center_as_one_process(small, tmp_path):
    """torchrun, 2 ranks: each rank samples its share with its head (rollout.rng=per_row), the loss adds
    its rows' centering term; the metrics are one process's (float32: within reordering)."""
    from test_distributed import torchrun

    args = small + ["steps=2", "eval.every=2", "rollout.rng=per_row", "rollout.dtype=bfloat16",
                    "+trick=score_centering", "score_centering.k=4", "rollout_correction=token_truncate"]
    assert train(compose(args), tmp_path / "single", args).state == "completed"
    work = tmp_path / "work"
    work.mkdir()
    two = torchrun(*args, f"hydra.run.dir={work}/run", cwd=work)
    assert two.returncode == 0, two.stderr[-3000:]
    from test_micro_batches import logged

    one, split = logged(tmp_path / "single"), logged(work / "run")
    assert len(one) == len(split)
    for a, b in zip(one, split):
        assert b == {k: pytest.approx(v, rel=1e-4, abs=1e-6) for k, v in a.items()}
    assert one[-1]["score_centering/residual_l1"] > 0


def test_only_the_trained_completions_carry_the_head(small, tmp_path, monkeypatch):
    """The sampler records its head for the completions the loss trains on; an eval's (8 samples a
    problem at T = 1 under the sampled protocol) are not trained on and carry none."""
    from grpo_ablate.sampling import engines

    heads = []
    real = engines.HFEngine.generate
    monkeypatch.setattr(engines.HFEngine, "generate",
                        lambda self, prompts, **kw: heads.append(kw["head"]) or real(self, prompts, **kw))
    args = small + ["steps=1", "eval=sampled", "eval.every=1", "rollout.dtype=bfloat16", "+trick=score_centering"]
    assert train(compose(args), tmp_path / "run", args).state == "completed"
    assert 32 in heads and 0 in heads   # the step's sampling; the evals at steps 0 and 1
