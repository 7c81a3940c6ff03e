"""Sampling filters (rollout.top_k, top_p, min_p) and the replay of their kept sets in the trainer.

The kept set is transformers' (its TopK, TopP and MinP logits processors, applied in that order);
the sampler records it per token; with rollout.sampling_replay every forward of the trainer scores
the distribution the sampler drew from (the kept set, renormalised), in float64 to 1e-10, with the
gradient of a renormalised log-softmax; without it the importance ratio's mean is the kept mass.
"""
import math

import pytest
import torch
from omegaconf import OmegaConf
from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from conftest import SMALL, cli, cli_here
from grpo_ablate.config.compose import compose
from grpo_ablate.config.identity import config_hash
from grpo_ablate.rundir.files import read_rows
from grpo_ablate.sampling.decode import NOT_KEPT, Rollout, concat_rollouts, generate, select_rows
from grpo_ablate.sampling.filters import SamplingFilters, kept_ids, kept_mask, replay_mask
from grpo_ablate.train.forward import completion_logprobs
from test_faults import refused, snapshot
from test_micro_batches import SPLITS, assert_split_invariant, float64_trainer

FILTERS = [SamplingFilters(top_p=0.8), SamplingFilters(top_k=3), SamplingFilters(min_p=0.2),
           SamplingFilters(top_k=6, top_p=0.7, min_p=0.05), SamplingFilters(top_k=1)]


def transformers_kept(probs: torch.Tensor, filters: SamplingFilters) -> torch.Tensor:
    """The tokens transformers' logits processors leave finite, in the order generate() applies them."""
    scores = probs.log()
    if filters.top_k:
        scores = TopKLogitsWarper(filters.top_k)(None, scores)
    if filters.top_p < 1:
        scores = TopPLogitsWarper(filters.top_p)(None, scores)
    if filters.min_p:
        scores = MinPLogitsWarper(filters.min_p)(None, scores)
    return torch.isfinite(scores)


@pytest.mark.parametrize("filters", FILTERS, ids=str)
def test_the_kept_set_is_transformers_and_its_ids_rebuild_it(filters):
    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(64, 40, generator=generator, dtype=torch.float64), dim=-1)
    kept = kept_mask(probs, filters)
    assert torch.equal(kept, transformers_kept(probs, filters))
    assert kept.gather(1, probs.argmax(1, keepdim=True)).all()         # the top token always stays
    ids = kept_ids(kept)
    assert ids.shape[1] == int(kept.sum(1).max()) and torch.equal(replay_mask(ids, 40), kept)


def test_a_position_without_a_kept_set_keeps_the_whole_vocabulary():
    ids = torch.tensor([[[2, 0, NOT_KEPT], [NOT_KEPT, NOT_KEPT, NOT_KEPT]]])
    mask = replay_mask(ids, 4)
    assert mask[0, 0].tolist() == [True, False, True, False] and mask[0, 1].all()


def test_concatenated_rollouts_pad_their_kept_sets_to_the_widest():
    def roll(width, sets):
        ids = torch.arange(width * sets).view(1, width, sets)
        return Rollout(torch.zeros(1, 2 + width, dtype=torch.long), torch.ones(1, 2 + width, dtype=torch.long), 2,
                       torch.ones(1, width), torch.zeros(1, dtype=torch.bool), torch.zeros(1, width), kept_ids=ids)
    both = concat_rollouts([roll(3, 2), roll(2, 4)], pad_id=0)   # (the rounds of dynamic sampling)
    assert both.kept_ids.shape == (2, 3, 4) and both.sampler_logprobs.shape == (2, 3)
    assert both.kept_ids[0, :, 2:].eq(NOT_KEPT).all() and both.kept_ids[1, 2].eq(NOT_KEPT).all()
    assert torch.equal(select_rows(both, torch.tensor([1])).kept_ids[0, :2], torch.arange(8).view(2, 4))


@pytest.fixture(scope="module")
def sampled(cache_dir):
    """A filtered rollout of the small test model in float64 (top_p = 0.7, top_k = 5)."""
    from grpo_ablate.models import load_model_and_tokenizer, model_dir
    from grpo_ablate.sampling.prompts import PromptEncoder
    from grpo_ablate.tasks import build_task

    cfg = compose([*SMALL, f"model.cache_dir={cache_dir}"])
    task = build_task(cfg.task)
    model, tokenizer = load_model_and_tokenizer(model_dir(cfg.model, task, log=lambda *_: None))
    model = model.double().eval()
    encode = PromptEncoder(tokenizer, task)
    prompts = [encode(p) for p in task.eval_set()[:4]]
    roll = generate(model, prompts, num_samples=4, max_new_tokens=10, temperature=1.3, eos_id=tokenizer.eos_token_id,
                    pad_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(0), lean=False,
                    filters=SamplingFilters(top_k=5, top_p=0.7))
    return model, roll


def test_the_sampler_draws_from_its_kept_set_and_scores_it_renormalised(sampled):
    model, roll = sampled
    mask = roll.completion_mask.bool()
    kept = replay_mask(roll.kept_ids, model.config.vocab_size)
    assert kept.gather(-1, roll.completion_ids[..., None]).squeeze(-1)[mask].all()
    assert roll.kept_ids[~mask].eq(NOT_KEPT).all()
    assert (roll.kept_ids.ne(NOT_KEPT).sum(-1)[mask] < model.config.vocab_size).any()   # something was cut
    with torch.no_grad():
        replayed = completion_logprobs(model, roll, 1.3)[0]
    assert torch.allclose(replayed[mask], roll.sampler_logprobs.double()[mask], atol=1e-5)   # float32 sampler


def test_replay_scores_the_renormalised_kept_distribution_with_its_gradient(sampled):
    """float64: log-prob, entropy and the gradient w.r.t. the logits of the replayed forward equal the
    formula on the logits the model gives: log softmax(z / T) over the kept set, e_y - p_kept."""
    model, roll = sampled
    T, mask = 1.3, roll.completion_mask.bool()
    kept = replay_mask(roll.kept_ids, model.config.vocab_size).scatter(-1, roll.completion_ids[..., None], True)
    captured = {}
    hook = model.lm_head.register_forward_hook(lambda m, i, out: captured.update(z=out))
    logp, entropy, _, log_mass = completion_logprobs(model, roll, T, entropy_grad=True, remove_padding=False,
                                                     return_energy=True, return_kept_mass=True)
    hook.remove()
    window = slice(-(roll.completion_mask.shape[1] + 1), -1)    # the logits predicting completion tokens
    z = captured["z"][:, window]
    expected = torch.log_softmax((z / T).masked_fill(~kept, -math.inf), dim=-1)
    p_kept = expected.exp()
    assert torch.allclose(logp[mask], expected.gather(-1, roll.completion_ids[..., None]).squeeze(-1)[mask],
                          rtol=1e-10, atol=1e-12)
    assert torch.allclose(entropy[mask], -(p_kept * expected.masked_fill(~kept, 0)).sum(-1)[mask], rtol=1e-10)
    full = torch.log_softmax(z / T, dim=-1)
    assert torch.allclose(log_mass[mask], torch.logsumexp(full.masked_fill(~kept, -math.inf), -1)[mask], rtol=1e-10)
    grad = torch.autograd.grad((logp * mask).sum(), captured["z"], retain_graph=True)[0][:, window]
    one_hot = torch.nn.functional.one_hot(roll.completion_ids, z.shape[-1]).double()
    assert torch.allclose(grad, (one_hot - p_kept) / T * mask[..., None], atol=1e-12)
    grad = torch.autograd.grad((entropy * mask).sum(), captured["z"])[0]
    assert torch.isfinite(grad).all()                                   # 0 log 0 outside the set: no NaN
    unreplayed = completion_logprobs(model, roll, T, score_kept_sets=False)[0]
    assert torch.allclose(unreplayed[mask], full.gather(-1, roll.completion_ids[..., None]).squeeze(-1)[mask])


def test_replayed_steps_are_the_same_in_any_micro_batches(cache_dir):
    """Kept sets ride with their rows: a split step's loss, gradients and metrics are the unsplit one's."""
    trainer = float64_trainer(["updates=multi", "rollout.top_p=0.6", "rollout.top_k=4", "rollout.max_new_tokens=12",
                               "rollout_correction=token_truncate", "optim.lr=1e-3"], cache_dir)
    whole = assert_split_invariant(trainer, SPLITS)
    assert whole["rollout/kept_mass"] < 1 and whole["rollout/ratio_mean_kept"] == pytest.approx(1, abs=1e-6)


@pytest.mark.parametrize("replay", [True, False])
def test_without_replay_the_ratio_mean_is_the_kept_mass(replay, small, tmp_path):
    out = cli("train", *small, "steps=2", "rollout.top_p=0.7",
              "rollout_correction=token_truncate", f"rollout.sampling_replay={str(replay).lower()}",
              "hydra.run.dir=run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = [r for r in read_rows(tmp_path / "run" / "metrics.jsonl") if "rollout/kept_mass" in r]
    assert len(rows) == 2
    for row in rows:
        assert row["rollout/kept_mass"] < 1
        # a float32 sampler and trainer: the ratio over the kept set is 1, over the vocabulary the kept mass
        assert row["rollout/ratio_mean_kept"] == pytest.approx(1, abs=1e-4)
        assert row["rollout/ratio_mean_full"] == pytest.approx(row["rollout/kept_mass"], abs=1e-4)
        assert 1 < row["rollout/kept_tokens_mean"] and row["rollout/one_token_frac"] < 1
    assert "samples greedily" not in out.stdout


@pytest.mark.full
@pytest.mark.parametrize("squeeze", ["rollout.top_p=0.000001", "rollout.min_p=0.9999999"])
def test_filters_that_keep_one_token_everywhere_are_said_at_the_first_step(squeeze, small, tmp_path):
    """Not knowable from the config (it depends on the model's distribution); the first step measures it: one
    kept token at every position is a greedy sampler, every group flat, nothing learned from the reward."""
    out = cli("train", *small, "steps=2", squeeze, "hydra.run.dir=run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    said = " ".join(out.stdout.split())
    assert said.count("kept a single token at every sampled position of this step: it samples greedily") == 1
    rows = [r for r in read_rows(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    assert all(r["rollout/one_token_frac"] == 1.0 and r["adv/mean"] == 0.0 for r in rows)


def test_filters_off_hash_as_runs_from_before_they_existed():
    cfg = compose([])
    before = OmegaConf.create(OmegaConf.to_container(cfg))
    for key in ("top_k", "top_p", "min_p", "sampling_replay"):
        del before.rollout[key]
    assert config_hash(before) == config_hash(cfg)
    assert config_hash(compose(["rollout.top_p=0.9"])) != config_hash(cfg)
    assert config_hash(compose(["rollout.top_p=0.9", "rollout.sampling_replay=false"])) != config_hash(
        compose(["rollout.top_p=0.9"]))


@pytest.mark.parametrize("args, needle", [
    (["rollout.top_p=0"], "rollout.top_p=0 is not allowed"),
    (["rollout.top_k=-1"], "rollout.top_k=-1 is not allowed"),
    (["rollout.min_p=1"], "rollout.min_p=1 is not allowed"),
])
def test_a_filter_out_of_range_is_one_line(args, needle, tmp_path):
    before = snapshot(tmp_path)
    refused(cli_here("train", *args, cwd=tmp_path), needle)
    assert snapshot(tmp_path) == before



@pytest.mark.full
def test_a_top_k_at_least_the_vocabulary_is_said_to_keep_every_token(small, tmp_path):
    out = cli("train", *small, "steps=1", "rollout.top_k=100000", "hydra.run.dir=run", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "rollout.top_k=100000 is at least the vocabulary (" in " ".join(out.stdout.split())
    assert read_rows(tmp_path / "run" / "metrics.jsonl")[-1]["rollout/one_token_frac"] == 0.0
