"""Run benchmark workload W1 (one GRPO step, tiny random Qwen2, CPU) in this process.

    python benchmarks/w1.py --impl trl|ours --beta 0.04 --steps 12 [--assets DIR] [--set KEY=VALUE ...]

Prints ONE JSON line on stdout (everything else goes to stderr):

    {"impl", "beta", "steps", "median_s", "min_s", "max_s", "peak_rss_mb",
     "split": {"generate_s", "reference_s", "update_s"}}

W1 is specified in /work/shared/bench/W1.md. Timing rules, shared by both implementations
(see `summarize`):
  - each implementation yields one record per optimizer step with "step_end" (a monotonic
    clock in seconds, e.g. time.perf_counter(), read right after that optimizer step; only
    differences are used) and the step's split "generate_s", "reference_s", "update_s";
  - step k's time is step_end[k] - step_end[k-1]; steps 1 and 2 are warm-up and dropped, so
    with --steps 12 the statistics cover steps 3..12 (10 step times), and the split medians
    are taken over the same steps;
  - peak RSS is resource.getrusage(RUSAGE_SELF).ru_maxrss of this whole process (KiB on
    Linux), so run one implementation per process (compare_trl.py does).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

# No network and no W&B while timing; must be set before transformers / TRL are imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))  # sibling module w1_assets, from any working directory

from w1_assets import build_assets, load_w1_tokenizer, w1_prompts, w1_reward  # noqa: E402

DEFAULT_ASSETS = REPO_ROOT / "runs" / "bench" / "w1_assets"  # runs/ is git-ignored
NUM_THREADS = 2  # W1: 2 threads
WARMUP_STEPS = 2  # W1: drop the first 2 steps
SPLIT_KEYS = ("generate_s", "reference_s", "update_s")

# W1's step, written once and used by the TRL side (grpo-ablate reads its own config).
PROMPTS_PER_STEP = 8
NUM_GENERATIONS = 8  # G
COMPLETIONS_PER_STEP = PROMPTS_PER_STEP * NUM_GENERATIONS  # 64
MAX_NEW_TOKENS = 24
LEARNING_RATE = 1e-5
CLIP_EPS = 0.2

TRL_MISSING = "trl is not installed: pip install -e '.[bench]'"


def die(message: str, code: int = 2) -> NoReturn:
    print(message, file=sys.stderr)
    raise SystemExit(code)


# ----------------------------------------------------------------------------------------------
# Aggregation, shared by both implementations
# ----------------------------------------------------------------------------------------------
def check_records(records: list[dict], steps: int, who: str) -> None:
    """Fail loudly if an implementation's per-step records are not what W1 needs."""
    if len(records) != steps:
        raise RuntimeError(f"{who} returned {len(records)} step records, expected {steps}")
    for i, rec in enumerate(records):
        missing = {"step_end", *SPLIT_KEYS} - set(rec)
        if missing:
            raise RuntimeError(f"{who}: step record {i} lacks {sorted(missing)}")
        if i and not rec["step_end"] > records[i - 1]["step_end"]:
            raise RuntimeError(f"{who}: step_end is not increasing at step record {i}")


def summarize(impl: str, beta: float, steps: int, records: list[dict]) -> dict:
    """Turn per-step records into W1's JSON result (see the module docstring for the rules)."""
    ends = [rec["step_end"] for rec in records]
    # step_times[j] is the time of step WARMUP_STEPS + 1 + j (1-based), i.e. steps 3..N
    step_times = [ends[k] - ends[k - 1] for k in range(WARMUP_STEPS, len(ends))]
    measured = records[WARMUP_STEPS:]
    peak_rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "impl": impl,
        "beta": beta,
        "steps": steps,
        "median_s": round(statistics.median(step_times), 4),
        "min_s": round(min(step_times), 4),
        "max_s": round(max(step_times), 4),
        "peak_rss_mb": round(peak_rss_kib / 1024, 1),
        "split": {k: round(statistics.median(rec[k] for rec in measured), 4) for k in SPLIT_KEYS},
    }


# ----------------------------------------------------------------------------------------------
# --impl ours: grpo-ablate's own runner
# ----------------------------------------------------------------------------------------------
def run_ours(assets_dir: str, beta: float, steps: int, extra: list[str]) -> list[dict]:
    """W1 through grpo-ablate's real trainer (see grpo_ablate/bench.py for the config)."""
    from grpo_ablate.bench import run_w1

    return run_w1(assets_dir, beta, steps, extra)


# ----------------------------------------------------------------------------------------------
# --impl trl: Hugging Face TRL's GRPOTrainer
# ----------------------------------------------------------------------------------------------
def run_trl(assets_dir: str, beta: float, steps: int) -> list[dict]:
    try:
        import trl  # noqa: F401
    except ImportError:
        die(TRL_MISSING)
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from transformers import TrainerCallback

    # W1's prompt stream in order: rows 8k..8k+7 are step k's prompts. With shuffle_dataset=False
    # TRL's RepeatSampler walks the rows in order, 8 prompts per step, each repeated G=8 times.
    rows = [{"prompt": p, "answer": a} for k in range(steps) for p, a in w1_prompts(k)]
    dataset = Dataset.from_list(rows)

    # What each rollout actually contained, checked after the run (see check_trl_rollouts).
    rollouts: list[dict] = []

    def w1_reward_func(prompts, completions, completion_ids, answer, **kwargs):
        # TRL decodes completions cut at the first <eos> with skip_special_tokens=True, which
        # is the same text W1's reward looks at (cut at first <eos>, stripped).
        rollouts.append({
            "prompts": list(prompts),
            "lengths": [len(ids) for ids in completion_ids],  # tokens generated, incl. <eos>
        })
        return [w1_reward(c, a) for c, a in zip(completions, answer)]

    class TimedGRPOTrainer(GRPOTrainer):
        """GRPOTrainer with wall-clock timers around the phases of W1's split.

        What each split field measures, per optimizer step:
          generate_s  = GRPOTrainer._generate: tokenize the 64 prompts, model.generate (KV-cached
                        sampling, up to 24 new tokens), cut at <eos>, decode to text, and the
                        completion-length metrics it logs;
          reference_s = the no-grad forward of the frozen reference model on the 64 sequences
                        (the `_get_per_token_logps_and_entropies` calls made with ref_model);
                        0 when beta=0, where TRL builds no reference model;
          update_s    = policy forward + loss + backward (training_step minus _prepare_inputs)
                        + gradient clipping, AdamW step, scheduler step and zero_grad (from the
                        end of training_step to the on_step_end callback).
        Not in any field (but in the step time): reward computation, advantage normalisation,
        tensor padding, dataloader and TRL's per-step logging.
        """

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.w1_records: list[dict] = []
            self._reset_timers()

        def _reset_timers(self):
            self._t = {"generate": 0.0, "reference": 0.0, "prepare": 0.0, "train_step": 0.0}
            self._train_step_end = None

        def _generate(self, prompts):
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            self._t["generate"] += time.perf_counter() - t0
            return out

        def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
            t0 = time.perf_counter()
            out = super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
            if self.ref_model is not None and model is self.ref_model:
                self._t["reference"] += time.perf_counter() - t0
            return out

        def _prepare_inputs(self, generation_batch):
            # generation + reference forward + rewards + advantages, all inside training_step
            t0 = time.perf_counter()
            out = super()._prepare_inputs(generation_batch)
            self._t["prepare"] += time.perf_counter() - t0
            return out

        def compute_loss(self, model, inputs, *args, **kwargs):
            rollouts[-1]["loss_rows"] = inputs["completion_ids"].size(0)  # sequences in the update
            return super().compute_loss(model, inputs, *args, **kwargs)

        def training_step(self, model, inputs, num_items_in_batch):
            t0 = time.perf_counter()
            out = super().training_step(model, inputs, num_items_in_batch)
            self._train_step_end = time.perf_counter()
            self._t["train_step"] += self._train_step_end - t0
            return out

        def w1_step_end(self):
            """Called from the on_step_end callback, right after the optimizer step."""
            now = time.perf_counter()
            fwd_bwd = self._t["train_step"] - self._t["prepare"]
            optimizer = now - self._train_step_end  # clip + AdamW + scheduler + zero_grad
            self.w1_records.append({
                "step_end": now,
                "generate_s": self._t["generate"],
                "reference_s": self._t["reference"],
                "update_s": fwd_bwd + optimizer,
            })
            self._reset_timers()

    class StepEndCallback(TrainerCallback):
        # Trainer calls on_step_end after optimizer.step(), lr_scheduler.step(), zero_grad() and
        # global_step += 1, and before its logging: the end of the optimizer step.
        def __init__(self):
            self.trainer = None

        def on_step_end(self, args, state, control, **kwargs):
            self.trainer.w1_step_end()

    # transformers 5.x renamed gradient_checkpointing to activation_checkpointing and keeps the
    # old name as an alias that is only read when the new one is unset; TRL 1.16 defaults the
    # old name to True. Set the field that has the final say in the installed transformers.
    field_names = {f.name for f in dataclasses.fields(GRPOConfig)}
    no_checkpointing = {
        "activation_checkpointing" if "activation_checkpointing" in field_names
        else "gradient_checkpointing": False
    }

    with tempfile.TemporaryDirectory(prefix="w1_trl_") as out_dir:
        config = GRPOConfig(
            output_dir=out_dir,  # nothing is saved (save_strategy="no"); TRL requires a path
            # --- batch: ONE optimizer step = ONE rollout of 8 prompts x G=8 = 64 completions ---
            # TRL counts batch sizes in completions, not prompts.
            per_device_train_batch_size=COMPLETIONS_PER_STEP,  # 64 completions per micro-batch
            gradient_accumulation_steps=1,  # no accumulation
            generation_batch_size=COMPLETIONS_PER_STEP,  # 64 -> steps_per_generation = 1
            num_generations=NUM_GENERATIONS,  # G = 8 completions per prompt
            num_iterations=1,  # one update per rollout (so TRL skips the old-logprob forward)
            max_steps=steps,
            shuffle_dataset=False,  # prompts in W1's order
            seed=0,
            # --- sampling ---
            max_completion_length=MAX_NEW_TOKENS,  # max_new_tokens=24
            temperature=1.0,
            top_k=0,  # 0 = off in TRL 1.16 (also its default)
            top_p=1.0,  # 1.0 = off (also its default)
            # --- loss ---
            loss_type="dapo",  # token-level: sum over all completion tokens / their count
            epsilon=CLIP_EPS,  # ratio clip 0.2 (epsilon_high defaults to epsilon)
            beta=beta,  # k3 KL to a frozen reference copy; 0.0 -> TRL builds no reference model
            # --- optimizer: AdamW, constant lr ---
            learning_rate=LEARNING_RATE,
            optim="adamw_torch",  # torch.optim.AdamW (transformers 5 defaults to the fused variant)
            lr_scheduler_type="constant",  # the Trainer default would decay linearly to 0
            weight_decay=0.0,
            max_grad_norm=1.0,  # Trainer/TRL default clipping kept (W1 does not mention it)
            # --- numerics / device: fp32 on CPU, no checkpointing ---
            use_cpu=True,
            bf16=False,  # TRL defaults bf16 to True
            fp16=False,
            **no_checkpointing,  # TRL defaults gradient checkpointing to True
            model_init_kwargs={"dtype": "float32"},
            # --- no eval, no saving, local logging only ---
            eval_strategy="no",
            save_strategy="no",
            report_to="none",
            logging_steps=1,  # TRL's metrics every step, kept in memory / printed to stderr
            disable_tqdm=True,
            log_completions=False,
            dataloader_num_workers=0,
        )
        trainer = TimedGRPOTrainer(
            model=assets_dir,  # loaded by path, as is the reference model when beta > 0
            reward_funcs=w1_reward_func,
            args=config,
            train_dataset=dataset,
            # Passed explicitly: AutoTokenizer would load a Qwen2Tokenizer (see load_w1_tokenizer)
            processing_class=load_w1_tokenizer(assets_dir),
        )
        callback = StepEndCallback()
        callback.trainer = trainer
        trainer.add_callback(callback)
        check_trl_setup(trainer, beta)
        trainer.train()

    check_trl_rollouts(rollouts, steps)
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # unwrap accelerate's
    assert type(optimizer).__name__ == "AdamW", type(optimizer)
    return trainer.w1_records


def check_trl_setup(trainer, beta: float) -> None:
    """Assert the trainer really is W1's configuration before timing it."""
    import torch

    args = trainer.args
    assert args.steps_per_generation == 1 and args.generation_batch_size == COMPLETIONS_PER_STEP
    assert trainer.loss_type == "dapo" and trainer.num_iterations == 1
    assert trainer.model.dtype == torch.float32 and not args.bf16 and not args.fp16
    model = trainer.model
    checkpointing = getattr(model, "is_activation_checkpointing", None)
    if checkpointing is None:  # transformers < 5.x name
        checkpointing = model.is_gradient_checkpointing
    assert not checkpointing, "activation (gradient) checkpointing is on"
    assert trainer.accelerator.device.type == "cpu"
    assert (trainer.ref_model is None) == (beta == 0.0), "reference model present iff beta > 0"
    gen = trainer.generation_config
    assert gen.max_new_tokens == MAX_NEW_TOKENS and gen.do_sample and gen.temperature == 1.0


def check_trl_rollouts(rollouts: list[dict], steps: int) -> None:
    """Each step scored 64 completions of exactly W1's 8 prompts (x8); report their lengths."""
    assert len(rollouts) == steps, f"{len(rollouts)} rollouts for {steps} steps"
    lengths, full_steps = [], 0
    for k, ro in enumerate(rollouts):
        expected = sorted(p for p, _ in w1_prompts(k) for _ in range(NUM_GENERATIONS))
        assert sorted(ro["prompts"]) == expected, f"step {k} did not use W1's prompts 8k..8k+7"
        assert max(ro["lengths"]) <= MAX_NEW_TOKENS
        assert ro["loss_rows"] == COMPLETIONS_PER_STEP, f"step {k}: {ro['loss_rows']} rows updated"
        lengths += ro["lengths"]
        full_steps += max(ro["lengths"]) == MAX_NEW_TOKENS  # generate ran all 24 decode steps
    full = sum(n == MAX_NEW_TOKENS for n in lengths) / len(lengths)
    print(
        f"[w1 trl] {len(lengths) // steps} completions/step, mean length "
        f"{statistics.mean(lengths):.1f} tokens, {full:.0%} of completions and "
        f"{full_steps}/{steps} steps reached {MAX_NEW_TOKENS} tokens",
        file=sys.stderr,
    )


# ----------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=("trl", "ours"), required=True)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--assets", default=str(DEFAULT_ASSETS), help="W1 model+tokenizer dir")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="--impl ours: one more grpo-ablate override, e.g. model.remove_padding=false")
    args = parser.parse_args()
    if args.steps <= WARMUP_STEPS:
        parser.error(f"--steps must exceed the {WARMUP_STEPS} warm-up steps")
    if args.beta < 0:
        parser.error("--beta must be >= 0")

    import torch

    torch.set_num_threads(NUM_THREADS)
    if os.getloadavg()[0] > 0.5:
        print(f"[w1] warning: 1-min load average is {os.getloadavg()[0]:.2f}; with {NUM_THREADS} "
              "threads on a small machine any other busy process distorts the timing badly",
              file=sys.stderr)
    assets_dir = build_assets(args.assets)  # reuses an existing build

    # The trainers print their logs on stdout; keep stdout for the one JSON line.
    with contextlib.redirect_stdout(sys.stderr):
        if args.impl == "trl":
            records = run_trl(assets_dir, args.beta, args.steps)
        else:
            records = run_ours(assets_dir, args.beta, args.steps, args.set)
    if torch.get_num_threads() != NUM_THREADS:
        print(f"[w1] warning: {args.impl} changed torch threads to {torch.get_num_threads()}",
              file=sys.stderr)
    check_records(records, args.steps, args.impl)
    ends = [rec["step_end"] for rec in records]
    print(f"[w1 {args.impl}] step times (s) of steps 2..{args.steps}: "
          + " ".join(f"{b - a:.3f}" for a, b in zip(ends, ends[1:])), file=sys.stderr)
    print(json.dumps(summarize(args.impl, args.beta, args.steps, records)), flush=True)


if __name__ == "__main__":
    main()
