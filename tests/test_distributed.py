"""Data-parallel training with torchrun (2 CPU processes, gloo): the same run as one process."""
import os
import subprocess
import sys

import pytest

from grpo_ablate.config.compose import compose
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows
from grpo_ablate.train.grpo import train


def torchrun(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "grpo_ablate.cli", "train", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def one_and_two_ranks(args, tmp_path, *two_only):
    """The same run in one process and over two torchrun ranks (`two_only`: overrides for the ranks alone):
    both runs' metrics.jsonl rows without their timings."""
    assert train(compose(args), tmp_path / "single", args).state == "completed"
    work = tmp_path / "work"
    work.mkdir()
    two = torchrun(*args, *two_only, f"hydra.run.dir={work}/run", cwd=work)
    assert two.returncode == 0, two.stderr[-3000:]
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]
    return strip(read_rows(tmp_path / "single" / "metrics.jsonl")), strip(read_rows(work / "run" / "metrics.jsonl"))


@pytest.mark.slow
def test_two_processes_match_one_process_on_the_same_global_batch(small, tmp_path):
    # token_mean normalises by the whole batch's token count, lite by the whole batch's reward
    # std: both are global statistics that a per-rank computation would get wrong.
    # two PPO mini-batches per rollout: each rank forwards its share of every mini-batch
    args = small + ["steps=2", "eval.every=1", "checkpoint_every=1", "samples_every=1", "loss_agg=token_mean",
                    "adv=lite", "kl.beta=0.1", "rollout.rng=per_row", "updates=mini_batches", "updates.mini_batches=2"]
    single = train(compose(args), tmp_path / "single", args)        # also warms the model cache
    assert single.state == "completed"
    work = tmp_path / "work"
    work.mkdir()
    # two processes: one step, then resumed to the second (checkpoints come from rank 0)
    first = torchrun(*[a for a in args if a != "steps=2"], "steps=1", f"hydra.run.dir={work}/run", cwd=work)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = torchrun("--resume", str(work / "run"), "steps=2", cwd=work)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.stdout.count("resuming") == 1 and resumed.stdout.count("completed at step 2") == 1  # rank 0 speaks

    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)} for r in rows]
    one, two = strip(read_rows(tmp_path / "single" / "metrics.jsonl")), strip(read_rows(work / "run" / "metrics.jsonl"))
    assert [r["step"] for r in two] == [0, 1, 2]                       # written once, by rank 0
    for a, b in zip(one, two):
        assert a.keys() == b.keys()
        assert b == {k: pytest.approx(v, rel=1e-3, abs=1e-6) for k, v in a.items()}
    assert one[2]["kl/k3"] > 0 and one[1]["adv/zero_std_group_frac"] < 1   # the runs did move
    assert len(read_rows(work / "run" / "samples.jsonl")) == len(read_rows(tmp_path / "single" / "samples.jsonl"))
    assert sorted(p.name for p in work.iterdir()) == ["run"]            # no second run dir


def test_a_slurm_job_step_with_several_tasks_is_one_run(monkeypatch):
    from grpo_ablate.train.distributed import DataParallel

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "unset")    # recorded, so the test leaves the environment as it was
        monkeypatch.delenv(key)
    for key, value in dict(SLURM_NTASKS="4", SLURM_PROCID="2", SLURM_LOCALID="2", SLURM_NNODES="1",
                           SLURM_JOB_ID="4242").items():
        monkeypatch.setenv(key, value)
    dp = DataParallel()
    assert (dp.world, dp.rank, dp.local_rank, dp.is_main) == (4, 2, 2, False)
    assert os.environ["MASTER_ADDR"] == "127.0.0.1" and os.environ["MASTER_PORT"] == "24242"
    assert [dp.share(10)] == [slice(6, 8)]          # ranks 0, 1 take 3 rows; 2, 3 take 2


@pytest.mark.slow
def test_two_processes_mask_the_same_groups_and_diagnose_the_same_rows(small, tmp_path):
    """sampling=variance_mass masks whole groups of the whole batch (each rank samples it all) and the
    template-collapse diagnostic scores the same sub-batch on every rank: two ranks log what one does."""
    args = small + ["steps=2", "eval.every=2", "loss_agg=token_mean", "rollout.rng=per_row", "sampling=variance_mass",
                    "sampling.top_p=0.5", "diag.input_dependence_every=1"]
    one, split = one_and_two_ranks(args, tmp_path)
    assert len(one) == len(split) == 3
    for a, b in zip(one, split):
        assert b == {k: pytest.approx(v, rel=1e-3, abs=1e-6) for k, v in a.items()}
    assert any(r.get("sampling/masked_group_frac", 0) > 0 for r in one) and one[1]["diag/input_dependence"] > 0


@pytest.mark.slow
def test_two_processes_gate_the_combined_ratio_as_one_process(small, tmp_path):
    """rollout_correction=combined_truncate gates each rank's tokens in its own loss forward, on pi_theta / mu
    (TRL AsyncGRPO without pi_old): two ranks, each with half of every mini-batch, log what one process does."""
    args = small + ["steps=2", "eval.every=2", "loss_agg=token_mean", "rollout.rng=per_row", "staleness=fixed",
                    "rollout_correction=combined_truncate", "rollout_correction.high=1.001",
                    "updates=mini_batches", "updates.mini_batches=2"]
    one, split = one_and_two_ranks(args, tmp_path)
    assert len(one) == len(split) == 3
    for a, b in zip(one, split):
        assert b == {k: pytest.approx(v, rel=1e-3, abs=1e-6) for k, v in a.items()}
    assert one[2]["rollout_corr/truncated_frac"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("updates", [["updates=mini_batches", "updates.mini_batches=2"], ["updates=single"]],
                         ids=["pi_old-forward", "own-forward"])
def test_two_processes_centre_on_the_same_top_k_as_one_process(updates, small, tmp_path):
    """clip=local: pi_old's top-K support and psi_old gathered from both ranks' forwards (mini-batches),
    or each forward's own (one step), in micro-batches: two ranks log what one process does."""
    args = small + ["steps=2", "eval.every=2", "loss_agg=token_mean", "rollout.rng=per_row", "clip=local",
                    "clip.topk=4", *updates]
    one, split = one_and_two_ranks(args, tmp_path, "updates.micro_batch_size=3")
    assert len(one) == len(split) == 3
    for a, b in zip(one, split):
        assert b == {k: pytest.approx(v, rel=1e-3, abs=1e-6) for k, v in a.items()}
    assert one[1]["local/residual_sq"] > 0
    assert (one[1]["local/feature_delta_abs"] > 0) == (updates[0] == "updates=mini_batches")


@pytest.mark.slow
@pytest.mark.parametrize("credit", [["turn_credit=mt_grpo", "loss_agg=token_mean"],
                                    ["adv=gae", "adv.timestep=turn", "loss_agg=turn_mean"]],
                         ids=["mt_grpo", "turn_gae+turn_mean"])
def test_two_processes_run_the_same_episodes_and_turn_credit_as_one_process(credit, small, tmp_path):
    """A multi-turn task with per-row draws: each episode's turns are drawn from its row's own uniforms, so two
    ranks sample, score and credit what one process does: turn_credit=mt_grpo (its turn rewards normalised in
    their groups), or the critic's turn-level GAE with each turn weighing the same in the loss."""
    args = [a for a in small if not a.startswith("task.")] + [
        "task=calculator", "task.eval_size=8", "rollout.max_new_tokens=24", "steps=2", "eval.every=2",
        "rollout.rng=per_row", *credit]
    one, split = one_and_two_ranks(args, tmp_path)
    assert len(one) == len(split) == 3
    for a, b in zip(one, split):
        assert b == {k: pytest.approx(v, rel=1e-3, abs=1e-6) for k, v in a.items()}
    assert one[1]["turns/env_tokens_mean"] > 0 and one[1]["turns/mean"] > 1
    assert (one[1]["turn_credit/shift"] > 0) == ("turn_credit=mt_grpo" in credit)
