"""Control runs: what happens without RL, from the same start, on the same eval schedule.

An ablation says "trick X adds 4 points", but a fast early gain on a small model can be the
warm-started base still improving. So every sweep can carry two controls, ordinary runs
with the run-dir contract of a GRPO run and the metric keys it shares with one:

    control=base   the starting policy, never updated. Each step samples B x G completions
                   exactly as a GRPO step would (reward, accuracy, length: a seed spread) and
                   the eval schedule runs greedy eval (a flat line).
    control=sft    continued supervised training on the task's reference solutions, from the
                   same start, same optimizer settings and eval schedule. Budget
                   `tokens`: each step trains on B x G fresh reference solutions, as many
                   completions as a GRPO step trains on; `wall`: `control.wall_s` seconds of
                   training in all, spread evenly over the steps.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from grpo_ablate.config import ConfigError, config_hash, validate
from grpo_ablate.train.distributed import DataParallel
from grpo_ablate.sampling.engines import HFEngine, Rollouts
from grpo_ablate.models import (ensure_warm_started, load_model_and_tokenizer, model_device, stop_token_ids,
                                supervised_batch)
from grpo_ablate.sampling.prompts import PromptEncoder
from grpo_ablate.tasks import build_task
from grpo_ablate.stopping import how_it_ended
from grpo_ablate.train.run_log import RunLog, save_checkpoint
from grpo_ablate.train.grpo import RunResult, _progress, already_finished, evaluate, open_run_dir, sample_groups


def run_control(cfg: DictConfig, run_dir: str | Path, overrides: list[str] = (), console=None) -> RunResult:
    run_dir = Path(run_dir)
    say = console.print if console is not None else (lambda *a, **k: None)
    validate(cfg)
    if DataParallel().world > 1:
        raise ConfigError("control runs train in one process; launch control=base|sft without torchrun")
    device = model_device(cfg.model)
    torch.set_flush_denormal(True)          # as in the trainer: denormals are ~100x slower on CPUs
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(cfg.seed)
    kind, steps = cfg.control.name, int(cfg.steps)
    B, G = int(cfg.rollout.prompts_per_step), int(cfg.rollout.group_size)
    lean = bool(cfg.rollout.lean_decoder)

    # --- resume or fresh start (the same rules as a GRPO run) ------------------------------
    status, checkpoint = open_run_dir(cfg, run_dir)
    if already_finished(status, cfg):
        say(f"{run_dir} is already {status['state']} at step {status['step']}; nothing to do")
        return RunResult(status["state"], status["step"], run_dir)

    task = build_task(cfg.task)
    if kind == "sft" and not getattr(task.train_batch(1, 0, 0)[0], "solution", None):
        raise ConfigError(f"control=sft trains on the task's reference solutions, and task={cfg.task.name} "
                          "has none; use control=base")
    model_path = cfg.model.path or ensure_warm_started(cfg.model, task, log=say)
    attn = cfg.model.attn_implementation
    attn = ("eager" if device.type == "cpu" else None) if attn == "auto" else attn
    policy, tokenizer = load_model_and_tokenizer(checkpoint or model_path, attn_implementation=attn)
    policy = policy.to(device)
    encode = PromptEncoder(tokenizer, task)          # the prompts exactly as a GRPO run sees them
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas),
                                  weight_decay=cfg.optim.weight_decay)
    warmup = max(1, int(cfg.optim.warmup_steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    sampler = torch.Generator().manual_seed(int(cfg.seed))
    rollouts = Rollouts(HFEngine(policy, lean), tokenizer, encode, task, DataParallel(), device,
                        eos_id=stop_token_ids(policy, tokenizer), max_new_tokens=int(cfg.rollout.max_new_tokens),
                        seed=int(cfg.seed), rng="stream", stream=sampler)
    start_step, trained_s = 0, 0.0
    if checkpoint is not None:
        state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        sampler.set_state(state["sampler"])
        start_step, trained_s = state["step"], state["trained_s"]
        say(f"resuming {run_dir} from step {start_step}")
    log = RunLog(run_dir, cfg, list(overrides), config_hash(cfg),
                 resume_step=start_step if checkpoint is not None else None)
    eval_problems = task.eval_set()
    run_started = time.perf_counter()
    result, step, progress = RunResult("running", start_step, run_dir), start_step, None

    def supervised_update(problems) -> tuple[float, float, int]:
        """One AdamW step on the reference solutions (mean NLL of solution tokens + EOS)."""
        policy.train()
        ids, mask, labels = supervised_batch(tokenizer, [encode(p) for p in problems],
                                             [p.solution for p in problems], device)
        loss = policy(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.optim.max_grad_norm)
        optimizer.step()
        schedule.step()
        return loss.item(), grad_norm.item(), int((labels != -100).sum())

    try:
        if start_step == 0:
            base = evaluate(policy, rollouts, eval_problems, int(cfg.eval.max_new_tokens))
            log.log({"step": 0, **base})
            result.base_accuracy = base["eval/accuracy"]
        progress = _progress(console, steps, start_step)
        metrics: dict = {}
        for step in range(start_step + 1, steps + 1):
            step_started = time.perf_counter()
            metrics = {"step": step}
            if kind == "base":
                # sample exactly as a GRPO step would, and change nothing
                policy.eval()
                batch = sample_groups(rollouts, task, cfg, step, float(cfg.temperature.value))
                lengths = batch.roll.lengths
                metrics.update({
                    "reward/mean": batch.scores.mean().item(),
                    "reward/std": batch.scores.std().item() if batch.scores.numel() > 1 else 0.0,
                    "train/accuracy": batch.scores.mean().item(),
                    "length/mean": lengths.float().mean().item(),
                    "length/max": lengths.max().item(),
                    "length/truncated_frac": batch.roll.truncated.float().mean().item(),
                    "perf/completion_tokens": int(lengths.sum()),
                })
            else:
                # the SFT budget: B x G solutions a step, or this step's share of wall_s
                losses, norms, tokens, updates = [], [], 0, 0
                while True:
                    problems = task.train_batch(B * G, int(cfg.seed), step, updates)
                    t0 = time.perf_counter()
                    loss, norm, n_tokens = supervised_update(problems)
                    trained_s += time.perf_counter() - t0
                    losses.append(loss), norms.append(norm)
                    tokens, updates = tokens + n_tokens, updates + 1
                    if cfg.control.budget == "tokens" or trained_s >= float(cfg.control.wall_s) * step / steps:
                        break
                metrics.update({"loss": sum(losses) / len(losses), "optim/grad_norm": norms[-1],
                                "optim/lr": schedule.get_last_lr()[0], "perf/completion_tokens": tokens})
            now = time.perf_counter()
            metrics.update({"time/step_s": now - step_started, "time/elapsed_s": now - run_started,
                            "perf/tokens_per_s": metrics["perf/completion_tokens"] / max(now - step_started, 1e-9)})
            if step % int(cfg.eval.every) == 0 or step == steps:
                metrics.update(evaluate(policy, rollouts, eval_problems, int(cfg.eval.max_new_tokens)))
            log.log(metrics)
            if step % int(cfg.checkpoint_every) == 0 or step == steps:
                save_checkpoint(run_dir, policy, tokenizer, {
                    "step": step, "trained_s": trained_s, "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(), "sampler": sampler.get_state()})
            log.status("running", step)
            progress.update(step, metrics, say)
        result.state, result.step = "completed", steps
        result.final_accuracy = metrics.get("eval/accuracy") if steps > start_step else None
        log.status("completed", steps)
        return result
    except BaseException as err:  # a crash, Ctrl-C or a stop from outside: record it, then let it propagate
        state, reason = how_it_ended(err)   # SLURM's time limit, scancel: interrupted (resumable), not failed
        log.status(state, step, reason[:500])
        raise
    finally:
        if progress is not None:
            progress.stop()
        log.close()

