"""FSDP (model.fsdp=true): 2 torchrun processes (CPU, gloo) with the model sharded give the
metrics of 1 process, its checkpoints are ordinary `from_pretrained` directories, and a run
resumed from one is exactly the run that was never stopped."""
import json

import pytest
import torch
from safetensors.torch import load_file
from test_distributed import torchrun

from conftest import SMALL
from grpo_ablate.config.compose import compose
from grpo_ablate.config.here import check_here
from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.models import ensure_warm_started
from grpo_ablate.rundir.files import TIMING_PREFIXES, read_rows
from grpo_ablate.tasks import build_task
from grpo_ablate.train.grpo import train

SHARDED = "model.fsdp: the policy is sharded over 2 processes"


def metrics(run_dir):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING_PREFIXES)}
            for r in read_rows(run_dir / "metrics.jsonl")]


def assert_close_rows(one: list[dict], two: list[dict]) -> None:
    assert [r["step"] for r in two] == [r["step"] for r in one]
    for a, b in zip(one, two):
        assert a.keys() == b.keys()
        assert b == {k: pytest.approx(v, rel=1e-3, abs=1e-6) for k, v in a.items()}


@pytest.mark.slow
def test_sharded_run_matches_one_process_and_resumes_exactly(small, tmp_path):
    # the embedded Qwen2-shaped model (tied embeddings; LeanDecoder samples it from the
    # gathered weights), a reference policy sharded too, two PPO mini-batches per rollout
    args = small + ["steps=2", "eval.every=1", "checkpoint_every=1", "samples_every=1", "rollout.rng=per_row",
                    "kl.beta=0.1", "loss_agg=token_mean", "updates=mini_batches", "updates.mini_batches=2"]
    single = train(compose(args), tmp_path / "single", args)        # also warms the model cache
    assert single.state == "completed"
    work = tmp_path / "work"
    work.mkdir()
    whole = torchrun(*args, "model.fsdp=true", f"hydra.run.dir={work}/whole", cwd=work)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert whole.stdout.count(SHARDED) == 1                              # rank 0 says it, once
    first = torchrun(*[a for a in args if a != "steps=2"], "steps=1", "model.fsdp=true",
                     f"hydra.run.dir={work}/resumed", cwd=work)
    assert first.returncode == 0, first.stderr[-3000:]
    again = torchrun("--resume", str(work / "resumed"), "steps=2", cwd=work)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("resuming") == 1 and again.stdout.count(SHARDED) == 1

    one = metrics(tmp_path / "single")
    assert_close_rows(one, metrics(work / "whole"))
    assert metrics(work / "resumed") == metrics(work / "whole")          # exact: full state round-trips
    assert one[2]["kl/k3"] > 0 and one[1]["adv/zero_std_group_frac"] < 1   # the runs did move

    # checkpoint/: rank 0's from_pretrained directory with the full weights and AdamW state
    checkpoints = {name: path / "checkpoint" for name, path in
                   (("single", tmp_path / "single"), ("whole", work / "whole"), ("resumed", work / "resumed"))}
    assert json.loads((checkpoints["whole"] / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    weights = {name: load_file(path / "model.safetensors") for name, path in checkpoints.items()}
    assert weights["whole"].keys() == weights["single"].keys()
    for key, value in weights["single"].items():
        assert torch.equal(weights["resumed"][key], weights["whole"][key]), key
        assert torch.allclose(weights["whole"][key], value, rtol=1e-4, atol=1e-6), key
    states = {name: torch.load(path / "trainer_state.pt", weights_only=False)["optimizer"]["state"]
              for name, path in checkpoints.items()}
    for index, per_param in states["single"].items():
        for key, value in per_param.items():
            assert type(states["whole"][index][key]) is torch.Tensor            # gathered, not a shard
            assert torch.equal(states["resumed"][index][key], states["whole"][index][key])
            assert torch.allclose(states["whole"][index][key], value, rtol=1e-3, atol=moment_atol(key, value))


# AdamW's moments of the sharded run against the one-process run: what float32 reordering allows.
# Sharding changes the order of the sums behind each gradient element (each rank sums its half of
# a mini-batch's 128 tokens, gloo adds the halves; the kernels' blocking differs with the shapes,
# and differently on AVX2 and AVX-512). A reordered sum of n terms moves by at most
# (n - 1) u sum|terms|, u = 2^-24: with n = 128 that is 7.6e-6 of the terms' absolute sum, which
# for an element whose gradient nearly cancels is large against the element itself (so no
# atol fixed in absolute units, 1e-9 was one, holds on every CPU) but stays at the scale of the
# tensor's largest gradients. Over the run's four optimizer steps the weights drift too (checked
# above to 1e-4), so exp_avg is bounded by 1e-4 of the tensor's largest |exp_avg|, exp_avg_sq
# (squares: twice the relative error) by 2e-4 of its largest, and `step` is exact.
MOMENT_SCALE = {"exp_avg": 1e-4, "exp_avg_sq": 2e-4, "step": 0.0}


def moment_atol(key: str, value: torch.Tensor) -> float:
    return MOMENT_SCALE[key] * float(value.abs().max())


def test_the_moment_tolerance_scales_with_the_tensor():
    # a reordering error of 1e-5 of the scale on an element that cancelled to ~0 passes; 1e-3 does not
    m = torch.tensor([0.5, -0.3, 1e-12])
    assert torch.allclose(m + torch.tensor([0.0, 0.0, 5e-6]), m, rtol=1e-3, atol=moment_atol("exp_avg", m))
    assert not torch.allclose(m + torch.tensor([0.0, 0.0, 5e-4]), m, rtol=1e-3, atol=moment_atol("exp_avg", m))
    assert moment_atol("step", torch.tensor(4.0)) == 0.0


@pytest.mark.slow
def test_sharded_lora_run_with_gradient_checkpointing_and_a_critic_matches_one_process(small, tmp_path):
    # LoRA on the warm-started small model as a user's model=hf; the reference is the base with
    # the adapters off; a value head and a learnable temperature live outside the sharded model;
    # a low grad-norm limit makes clipping act on sharded and whole gradients together
    cfg = compose(small)
    path = ensure_warm_started(cfg.model, build_task(cfg.task))
    run = [a for a in SMALL if not a.startswith("model.")] + [
        "model=hf", f"model.path={path}", "model.device=cpu", "model.lora.r=4", "model.lora.alpha=8",
        "model.gradient_checkpointing=true", "+trick=critic_gae", "temperature=learnable", "kl.beta=0.1",
        "optim.max_grad_norm=0.05", "optim.lr=1e-2", "rollout.rng=per_row", "steps=2", "eval.every=2",
        "checkpoint_every=2"]
    single = train(compose(run), tmp_path / "single", run)
    assert single.state == "completed"
    work = tmp_path / "work"
    work.mkdir()
    two = torchrun(*run, "model.fsdp=true", f"hydra.run.dir={work}/run", cwd=work)
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count(SHARDED) == 1
    one = metrics(tmp_path / "single")
    assert_close_rows(one, metrics(work / "run"))
    assert all(r["optim/grad_norm"] > 0.05 for r in one[1:])            # clipping acted
    assert one[2]["kl/k3"] > 0 and one[2]["temperature/value"] != 1.0   # adapters and T moved
    adapters = load_file(work / "run" / "checkpoint" / "adapter_model.safetensors")
    expected = load_file(tmp_path / "single" / "checkpoint" / "adapter_model.safetensors")
    assert adapters.keys() == expected.keys() and all("lora_" in key for key in adapters)
    for key, value in expected.items():
        assert torch.allclose(adapters[key], value, rtol=1e-3, atol=1e-6), key


@pytest.mark.parametrize("extra, message", [
    (["rollout=vllm"], "model.fsdp=true does not work with rollout=vllm"),
    (["kl=two_layer"], "model.fsdp=true does not work with kl=two_layer"),
    (["diag.grad_conflict=true"], "model.fsdp=true does not work with diag.grad_conflict=true"),
    (["control=sft"], "model.fsdp=true does not work with control=sft"),
    (["ref_sync=mixup"], "model.fsdp=true does not work with ref_sync=mixup"),
])
def test_what_fsdp_does_not_combine_with_is_one_clear_error(small, extra, message):
    with pytest.raises(ConfigError, match=message):
        validate(compose(small + ["model.fsdp=true", *extra]))


def test_fsdp_refuses_float16_and_a_non_boolean(tmp_path):
    hf = ["model=hf", f"model.path={tmp_path}", "model.fsdp=true"]
    with pytest.raises(ConfigError, match="model.fsdp=true does not work with model.dtype=float16"):
        validate(compose(hf + ["model.dtype=float16"]))
    with pytest.raises(ConfigError, match="model.fsdp='yes' is not allowed; allowed: true, false"):
        validate(compose(hf[:2] + ["model.fsdp=yes"]))


def test_fsdp_needs_several_processes(small, monkeypatch):
    for key in ("WORLD_SIZE", "RANK", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    cfg = compose(small + ["model.fsdp=true"])
    validate(cfg)                     # the config is fine: a sweep can plan it anywhere
    with pytest.raises(ConfigError,
                       match="model.fsdp=true shards the model over several processes, and this run has one"):
        check_here(cfg)
