"""Micro-batches (updates.micro_batch_size, updates.max_tokens_per_forward): an optimizer step's
forward and backward in pieces, the gradients accumulated, one optimizer step per mini-batch.

The proof is float64 on the tiny test model: the loss, every parameter's gradient and every
logged metric of a step are the unsplit step's (<= 1e-10 relative) whether it runs as 1, 2, 3
or 8 micro-batches or under a token budget, with the completions' uneven lengths as sampled;
for every loss_agg mode and every option of the families that weigh or mask the loss's tokens
(derived from the registry: a new option is in the table by itself), unless the option refuses
micro-batches in one line (its statistic is over one forward's rows).
"""
import copy
from dataclasses import replace

import pytest
import torch

from conftest import SMALL, cli, cli_here
from grpo_ablate.config.compose import compose
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows
from grpo_ablate.config.spec import run_spec
from grpo_ablate.train.batch import micro_batches
from grpo_ablate.train.distributed import DataParallel
from grpo_ablate.train.grpo import build_grpo
from grpo_ablate.tricks.registry import options
from test_faults import refused, snapshot

# two optimizer steps on the whole rollout of 4 groups x 4 = 16 rows: the second is off-policy,
# so the ratio-based options act; a KL term, so its weights and estimators enter the loss
BASE = ["updates=multi", "kl.beta=0.05", "rollout.max_new_tokens=12", "optim.lr=1e-3"]
# micro-batches of one optimizer step's 16 rows: 2, 3 (6 + 6 + 4: uneven) and 8, and a token budget
SPLITS = {"2": {"micro_batch_size": 8}, "3": {"micro_batch_size": 6}, "8": {"micro_batch_size": 2},
          "budget": {"max_tokens_per_forward": 50}}
# the families whose options weigh or mask the loss's tokens or normalise it
NORMALISING = ("loss_agg", "token_mask", "off_policy_mask", "rollout_correction", "overlong", "clip", "kl_weight",
               "sampling", "proximal", "value_clip", "lr_scale", "score_centering")
# what an option needs besides BASE to act (a sampler that differs from the trainer, a critic, ...)
NEEDS = {"rollout_correction": ["rollout.dtype=bfloat16"], "off_policy_mask": ["rollout.dtype=bfloat16"],
         "proximal": ["rollout.dtype=bfloat16", "rollout_correction=token_truncate"],
         "lr_scale": ["rollout.dtype=bfloat16"], "value_clip": ["adv=gae"],
         "score_centering": ["rollout.dtype=bfloat16"],
         ("score_centering", "top_k"): ["score_centering.k=4"],   # a head with a tail
         ("sampling", "replay"): ["sampling.max_rounds=1"]}


def test_micro_batches_are_consecutive_and_within_both_limits():
    tokens = [5, 9, 3, 7, 30, 2, 2, 2]
    assert micro_batches(tokens, None, None) == [slice(None)]
    assert micro_batches(tokens, 3, None) == [slice(0, 3), slice(3, 6), slice(6, 8)]
    assert micro_batches(tokens, None, 20) == [slice(0, 3), slice(3, 4), slice(4, 5), slice(5, 8)]  # 30 alone
    assert micro_batches(tokens, 2, 12) == [slice(0, 1), slice(1, 3), slice(3, 4), slice(4, 5), slice(5, 7),
                                            slice(7, 8)]


def overrides_of(family: str, name: str) -> list[str]:
    return [*BASE, *NEEDS.get(family, []), *NEEDS.get((family, name), []), f"{family}={name}"]


def cases():
    out = [(f, n) for f in NORMALISING for n in options(f)]
    # the critic (values and loss through the same pieces), a per-token energy from the pi_old forward
    # (OTB), a plugin's anchor forward (pi_prev)
    return out + [("adv", "gae"), ("adv", "optimal_token_baseline"), ("kl", "two_layer")]


def float64_trainer(overrides, cache_dir):
    """The run's trainer with its models in float64 (the sampler still samples in float32: its
    log-probs are inputs, the same for every split)."""
    cfg = compose(SMALL + [f"model.cache_dir={cache_dir}", *overrides])
    validate(cfg)
    trainer, _ = build_grpo(run_spec(cfg), torch.device("cpu"), DataParallel(), None, lambda *a, **k: None)
    for model in (trainer.p.policy, trainer.p.reference, trainer.p.value_head):
        if model is not None:
            model.double()
    return trainer


def one_step(trainer, start, **split):
    """Step 0 from the same weights and state, split as told: (metrics, the last optimizer step's gradients)."""
    trainer.model.load_state_dict(start[0])
    trainer.load_state_dict(copy.deepcopy(start[1]))
    trainer.spec = replace(start[2], updates=replace(start[2].updates, **split))
    metrics = trainer.step(0).metrics
    return ({k: v for k, v in metrics.items() if not k.startswith(TIMING_PREFIXES)},
            [p.grad.clone() for p in trainer.trained])


def assert_split_invariant(trainer, splits: dict) -> dict:
    """Step 0 unsplit, then in each of `splits`: the same metrics and gradients (the unsplit metrics back)."""
    start = (copy.deepcopy(trainer.model.state_dict()), copy.deepcopy(trainer.state_dict()), trainer.spec)
    whole, grads = one_step(trainer, start)
    for name, split in splits.items():
        metrics, split_grads = one_step(trainer, start, **split)
        assert metrics.keys() == whole.keys(), name
        assert metrics == {k: pytest.approx(v, rel=1e-10, abs=1e-12) for k, v in whole.items()}, name
        for got, expected in zip(split_grads, grads):
            assert (got - expected).norm() <= 1e-10 * expected.norm() + 1e-14, name
    return whole


def refused_split(overrides) -> bool:
    """Whether the config refuses micro-batches because an option's statistic is over one forward."""
    try:
        validate(compose(SMALL + [*overrides, "updates.micro_batch_size=2"]))
    except ConfigError as err:
        assert "over the rows of one forward" in str(err), err
        return True
    return False


@pytest.mark.parametrize("mode", list(options("loss_agg")))
def test_every_loss_agg_mode_is_the_same_in_uneven_micro_batches(mode, cache_dir):
    """One optimizer step on 16 rows as 6 + 6 + 4: the weights are the mini-batch's, not each piece's."""
    trainer = float64_trainer(["updates=single", "kl.beta=0.05", f"loss_agg={mode}"], cache_dir)
    whole = assert_split_invariant(trainer, {"3": SPLITS["3"]})
    assert whole["ppo/optimizer_steps"] == 1 and whole["loss"] != 0


# the normalising options the issue names, together, each set to act (its metric says it did): token
# masks (chosen over the whole mini-batch), rejection's and M2PO's masks, the overlong filter of truncated
# completions, zero-variance filtering, a critic; and the gradient diagnostics, whose forward is split too
TOGETHER = {"masks": (["token_mask=high_entropy", "token_mask.quantile=0.5", "rollout.dtype=bfloat16",
                       "rollout_correction=rejection", "rollout_correction.high=1e-5", "overlong=filter",
                       "rollout.max_new_tokens=8", "loss_agg=token_mean", "diag.grad_conflict=true", "diag.every=1"],
                      ("token_mask/dropped_frac", "rollout_corr/rejected_frac", "overlong/masked_frac",
                       "grad_norm/policy")),
            "m2po, critic": (["rollout.dtype=bfloat16", "rollout_correction=m2po", "rollout_correction.threshold=1e-6",
                              "sampling=zero_variance", "adv=gae", "loss_agg=prompt_mean"],
                             ("rollout_corr/masked_frac", "value/loss")),
            # whole groups masked out of the loss by their share of the reward variance, and the template-collapse
            # diagnostic, whose forward is split too (RAGEN-2)
            "variance mass, input dependence": (["sampling=variance_mass", "sampling.top_p=0.5",
                                                 "loss_agg=seq_mean_token_sum", "diag.input_dependence_every=1"],
                                                ("sampling/masked_group_frac", "diag/input_dependence")),
            # the combined-ratio gate (TRL AsyncGRPO), computed in the loss on each forward's pi_theta / mu
            "combined ratio": (["rollout.dtype=bfloat16", "rollout_correction=combined_truncate",
                                "rollout_correction.high=1.001", "rollout_correction.low=0.999"],
                               ("rollout_corr/truncated_frac",)),
            # LOCAL's regression on logits centred on pi_old's top-K: the support and psi_old from pi_old's forward,
            # sliced with each micro-batch's rows (its one-step form, on the update's own forward: test_local_loss)
            "local logit regression": (["clip=local", "clip.topk=4", "loss_agg=token_mean"],
                                       ("local/feature_delta_abs", "local/residual_sq")),
            # score centering from a bf16 sampler's top-4 head (a tail), its ids weighed by TIS's rule, under a
            # token mask, and the diagnostics' policy term with it
            "score centering": (["rollout.dtype=bfloat16", "score_centering=top_k", "score_centering.k=4",
                                 "rollout_correction=token_truncate", "token_mask=high_entropy",
                                 "token_mask.quantile=0.5", "diag.grad_conflict=true", "diag.every=1"],
                                ("score_centering/residual_l1", "token_mask/dropped_frac", "grad_norm/policy"))}


@pytest.mark.parametrize("case", list(TOGETHER))
def test_the_normalising_options_are_the_same_in_1_2_3_or_8_micro_batches(case, cache_dir):
    overrides, acted = TOGETHER[case]
    trainer = float64_trainer([*BASE, *overrides], cache_dir)
    whole = assert_split_invariant(trainer, SPLITS)
    assert whole["ppo/optimizer_steps"] == 2 and whole["loss"] != 0
    assert all(whole[metric] > 0 for metric in acted), {metric: whole[metric] for metric in acted}


@pytest.mark.slow
@pytest.mark.parametrize("family, name", cases(), ids=lambda v: str(v))
def test_every_option_that_weighs_the_loss_is_the_same_in_any_micro_batches_or_refuses_them(family, name, cache_dir):
    """Every option of the families that weigh, mask or normalise the loss (from the registry: a
    new one is in this table by itself) either refuses the split in one line or gives the same step."""
    overrides = overrides_of(family, name)
    if refused_split(overrides):
        return
    whole = assert_split_invariant(float64_trainer(overrides, cache_dir), SPLITS)
    assert whole["ppo/optimizer_steps"] == 2 and whole["loss"] != 0


@pytest.mark.parametrize("args, needle", [
    (["updates.micro_batch_size=0"], "updates.micro_batch_size=0 is not allowed; it must be an integer >= 1"),
    (["updates.max_tokens_per_forward=2.5"], "updates.max_tokens_per_forward=2.5 is not allowed; it must be an"),
    (["clip=clip_cov", "updates.micro_batch_size=4"],
     "clip=clip_cov's covariance and its draw of tokens is over the rows of one forward, so "
     "updates.micro_batch_size=4 would change the loss; allowed: updates.micro_batch_size=null and "
     "updates.max_tokens_per_forward=null with it"),
    (["clip=kl_cov", "updates.max_tokens_per_forward=64"], "clip=kl_cov's covariance and its top tokens is over"),
    (["clip=gmpo", "updates.micro_batch_size=4"], "clip=gmpo's mean_over=all (the share of live rows) is over"),
    (["kl=fixed", "kl.beta=0.1", "kl_weight=entropy", "updates.micro_batch_size=4"],
     "kl_weight=entropy's mean entropy is over the rows of one forward"),
    (["model.fsdp=true", "updates.micro_batch_size=4"],
     "updates.micro_batch_size=4 is not supported with model.fsdp=true"),
])
def test_micro_batches_refused_where_they_would_change_the_loss(args, needle, tmp_path):
    before = snapshot(tmp_path)
    refused(cli_here("train", *args, cwd=tmp_path), needle)
    assert snapshot(tmp_path) == before


def test_gmpo_over_live_rows_takes_micro_batches():
    validate(compose(["clip=gmpo", "clip.mean_over=live", "updates.micro_batch_size=4"]))


def untimed(rows) -> list[dict]:
    """Metrics rows without the timings."""
    return [{k: v for k, v in row.items() if not k.startswith(TIMING_PREFIXES)} for row in rows]


def logged(run_dir) -> list[dict]:
    """A run's metrics rows without the timings."""
    return untimed(read_rows(run_dir / "metrics.jsonl"))


def test_the_split_is_not_part_of_what_a_run_computes():
    """A run that ran out of memory resumes split: the split is out of the config hash, as threads
    are, and the unsplit default hashes as it did before the settings existed (old runs resume)."""
    from grpo_ablate.config.identity import config_hash
    from omegaconf import OmegaConf

    whole = compose([])
    split = compose(["updates.micro_batch_size=2", "updates.max_tokens_per_forward=64"])
    assert config_hash(whole) == config_hash(split)
    before = OmegaConf.create(OmegaConf.to_container(whole))
    del before.updates["micro_batch_size"], before.updates["max_tokens_per_forward"]
    assert config_hash(before) == config_hash(whole)
    assert config_hash(compose(["updates=mini_batches"])) != config_hash(whole)


@pytest.mark.slow
def test_a_run_in_micro_batches_through_the_cli_logs_what_the_unsplit_run_logs(small, tmp_path):
    """float32: the same metrics within reordering, with mini-batches, a KL term and the token budget."""
    args = small + ["steps=2", "eval.every=1", "updates=mini_batches", "updates.mini_batches=2", "kl.beta=0.05",
                    "loss_agg=token_mean"]
    runs = {}
    for name, split in (("whole", []), ("micro", ["updates.micro_batch_size=3"]),
                        ("budget", ["updates.max_tokens_per_forward=60"])):
        out = cli("train", *args, *split, f"hydra.run.dir={tmp_path / name}", cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[name] = logged(tmp_path / name)
    for name in ("micro", "budget"):
        for a, b in zip(runs["whole"], runs[name]):
            assert b == {k: pytest.approx(v, rel=1e-4, abs=1e-6) for k, v in a.items()}, name
    assert runs["whole"][-1]["ppo/optimizer_steps"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(options("loss_agg")))
def test_two_ranks_in_micro_batches_match_one_process_in_one_forward(mode, small, tmp_path):
    """torchrun, 2 ranks (gloo): each rank's share of each mini-batch in micro-batches of at most 3
    rows and 50 tokens (the ranks' counts of them can differ: DDP reduces once, at the last), token_mask
    choosing over both ranks' rows, against one process without a split (float32: within reordering)."""
    from test_distributed import torchrun

    from grpo_ablate.train.grpo import train

    args = small + ["steps=1", "eval.every=1", f"loss_agg={mode}", "kl.beta=0.05", "rollout.rng=per_row",
                    "updates=mini_batches", "updates.mini_batches=2", "token_mask=high_entropy"]
    single = train(compose(args), tmp_path / "single", args)
    assert single.state == "completed"
    work = tmp_path / "work"
    work.mkdir()
    two = torchrun(*args, "updates.micro_batch_size=3", "updates.max_tokens_per_forward=50",
                   f"hydra.run.dir={work}/run", cwd=work)
    assert two.returncode == 0, two.stderr[-3000:]
    one, split = logged(tmp_path / "single"), logged(work / "run")
    assert len(one) == len(split) == 2
    for a, b in zip(one, split):
        assert b == {k: pytest.approx(v, rel=1e-4, abs=1e-6) for k, v in a.items()}
    assert one[1]["token_mask/dropped_frac"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("arch, extra", [("llama", ["model.lora.r=4"]), ("gpt2", [])], ids=["lora", "gpt2-padded"])
def test_saved_models_in_micro_batches_log_what_one_forward_logs(tiny_models, tmp_path, arch, extra):
    """LoRA (the reference: the adapters off) and GPT-2 (not packable: the padded forward), one row a
    forward, against one forward (float32: within reordering)."""
    from test_real_models import MOVES, hf_run, run

    args = hf_run(tiny_models[arch], *MOVES, "kl.beta=0.1", *extra)
    whole = run(args, tmp_path / "whole")
    split = run([*args, "updates.micro_batch_size=1"], tmp_path / "split")
    for a, b in zip(untimed(whole), untimed(split)):
        assert b == {k: pytest.approx(v, rel=1e-4, abs=1e-6) for k, v in a.items()}
    assert whole[2]["kl/k3"] > 0


@pytest.mark.full
def test_a_resume_with_another_split_says_it_is_not_bit_for_bit(small, tmp_path):
    """Allowed (a run that ran out of memory resumes split), and said: the numbers from there on differ from the
    unsplit run's in the last bits, where a resume with the same split continues it exactly."""
    args = small + ["steps=1", "eval.every=1", "checkpoint_every=1", f"hydra.run.dir={tmp_path / 'run'}"]
    assert cli("train", *args, cwd=tmp_path).returncode == 0
    same = cli("train", "--resume", str(tmp_path / "run"), "steps=2", cwd=tmp_path)
    assert same.returncode == 0 and "warning" not in same.stderr, same.stderr[-2000:]
    split = cli("train", "--resume", str(tmp_path / "run"), "steps=3", "updates.micro_batch_size=2", cwd=tmp_path)
    assert split.returncode == 0, split.stderr[-2000:]
    assert ("warning: resuming with updates.micro_batch_size=2 (was null): the split sums each step's gradient in "
            "another order") in " ".join(split.stderr.split())
