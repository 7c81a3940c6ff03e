"""Benchmark workload W1 (../shared/bench/W1.md) through the real trainer.

`benchmarks/w1.py --impl ours` calls `run_w1`; it runs `grpo-ablate train` in this process
on W1's model (loaded by path like any user model) and W1's step: 8 prompts x G=8,
24 new tokens, lr 1e-5, token_mean, ratio clip 0.2, k3 KL with beta (0: no reference model),
fp32, 2 threads, no W&B. The only difference from W1.md is which 2-digit prompts each step
draws (our task's stream, same distribution); with a random model every reward is 0 anyway.
"""
from __future__ import annotations

import tempfile

from grpo_ablate.config.compose import compose
from grpo_ablate.rundir.files import read_rows
from grpo_ablate.train.grpo import train


def w1_overrides(assets_dir: str, beta: float, steps: int) -> list[str]:
    return [
        "model=hf", f"model.path={assets_dir}",
        "task.trace=false", "task.operand_min=10", "task.operand_max=99", "task.eval_size=8",
        "rollout.prompts_per_step=8", "rollout.group_size=8", "rollout.max_new_tokens=24",
        "optim.lr=1e-5", "loss_agg=token_mean", "clip=symmetric",
        "kl=fixed" if beta > 0 else "kl=none", f"kl.beta={beta}",
        f"steps={steps}", "threads=2", "logger=none",
        # no evaluation, checkpoint or samples inside the timed steps (only at step 0 and the end)
        f"eval.every={steps + 1}", f"checkpoint_every={steps + 1}", f"samples_every={steps + 1}",
    ]


def run_w1(assets_dir: str, beta: float, steps: int, extra: list[str] = ()) -> list[dict]:
    """One record per optimizer step: step_end (s since start) and the time split. `extra`:
    overrides after W1's (e.g. model.remove_padding=false, to time what an option buys)."""
    with tempfile.TemporaryDirectory(prefix="w1-ours-") as run_dir:
        overrides = [*w1_overrides(assets_dir, beta, steps), *extra]
        result = train(compose(overrides), run_dir, overrides)
        if result.state != "completed":
            raise RuntimeError(f"W1 run ended {result.state}: {result.reason}")
        rows = [r for r in read_rows(f"{run_dir}/metrics.jsonl") if r["step"] >= 1]
    return [{"step_end": r["time/elapsed_s"], "generate_s": r["time/sample_s"],
             "reference_s": r["time/reference_s"], "update_s": r["time/update_s"]} for r in rows]
