"""Control runs: what happens without RL, from the same start, on the same eval schedule.

An ablation says "trick X adds 4 points", but a fast early gain on a small model can be the
warm-started base still improving. So every sweep can carry two controls, ordinary runs
with the run-dir contract of a GRPO run and the metric keys it shares with one:

    control=base   the starting policy, never updated. Each step samples B x G completions
                   exactly as a GRPO step would (reward, accuracy, length: a seed spread) and
                   the eval schedule runs greedy eval (a flat line). With control.sample=false
                   (a sweep's base controls) it samples nothing and evaluates once: greedy
                   decoding of weights that never change gives the same eval at every point.
    control=sft    continued supervised training on the task's reference solutions, from the
                   same start, same optimizer settings and eval schedule. Budget
                   `tokens`: each step trains on B x G fresh reference solutions, as many
                   completions as a GRPO step trains on; `wall`: `control.wall_s` seconds of
                   training in all, spread evenly over the steps.

Both run in the same skeleton as a GRPO run (train/run.py): resume, schedule, status.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from grpo_ablate.config import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.models import (disable_dropout, load_model_and_tokenizer, model_device, model_dir,
                                stop_token_ids, supervised_batch)
from grpo_ablate.sampling.engines import HFEngine, Rollouts
from grpo_ablate.sampling.prompts import PromptEncoder
from grpo_ablate.tasks import build_task
from grpo_ablate.train.distributed import DataParallel
from grpo_ablate.resume_rules import already_finished, open_run_dir
from grpo_ablate.spec import RunSpec, run_spec
from grpo_ablate.train.run import (Optimization, RunResult, StepResult, attention_implementation, evaluate,
                                   finished_result, prepare_process, run_steps)
from grpo_ablate.rundir import DirLock
from grpo_ablate.train.batch import TaskPrompts, sample_groups


def run_control(cfg: DictConfig, run_dir: str | Path, overrides: list[str] = (), console=None) -> RunResult:
    run_dir = Path(run_dir)
    say = console.print if console is not None else (lambda *a, **k: None)
    validate(cfg)
    spec = run_spec(cfg)   # below, as in a GRPO run, only the spec travels (spec.py)
    if DataParallel().world > 1:
        raise ConfigError("control runs train in one process; launch control=base|sft without torchrun")
    prepare_process(spec.threads, spec.seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    with DirLock(run_dir, "run dir", say):   # one writer a run dir, as a GRPO run
        status, checkpoint = open_run_dir(cfg, run_dir)   # the same resume rules as a GRPO run
        if already_finished(status, cfg):
            return finished_result(status, run_dir, say)
        control = ControlStep(spec, model_device(cfg.model), checkpoint, say)
        return run_steps(spec.schedule, spec.record, run_dir, overrides, control, checkpoint, console)


class ControlStep:
    """The `Trainer` of a control run (train/run.py): sample and change nothing (base), or one
    step's budget of supervised updates on reference solutions (sft)."""

    def __init__(self, spec: RunSpec, device: torch.device, checkpoint: Path | None, say):
        self.spec, self.kind, self.device = spec, spec.control.name, device
        self.task = build_task(spec.task)
        if self.kind == "sft" and not getattr(self.task.train_batch(1, 0, 0)[0], "solution", None):
            raise ConfigError(f"control=sft trains on the task's reference solutions, and task={spec.task.name} "
                              "has none; use control=base")
        model_path = model_dir(spec.model.group, self.task, log=say)
        attn = attention_implementation(spec.model.attn_implementation, device)
        self.model, self.tokenizer = load_model_and_tokenizer(checkpoint or model_path, attn_implementation=attn)
        if spec.model.disable_dropout:   # as the GRPO runs it is compared with
            disable_dropout(self.model)
        self.model = self.model.to(device)
        self.encode = PromptEncoder(self.tokenizer, self.task)   # the prompts exactly as a GRPO run sees them
        self.optim = Optimization(self.model.parameters(), spec.optim, spec.seed, spec.schedule.steps)
        self.rollouts = Rollouts(HFEngine(self.model, spec.rollout.lean_decoder), self.tokenizer, self.encode,
                                 self.task, DataParallel(), device, eos_id=stop_token_ids(self.model, self.tokenizer),
                                 max_new_tokens=spec.rollout.max_new_tokens, seed=spec.seed, rng="stream",
                                 stream=self.optim.rng)
        self.eval_problems = self.task.eval_set()
        self.trained_s = 0.0      # seconds of supervised training so far (the wall budget)
        self.started = time.perf_counter()
        # eval only: the start's eval, once (None until it ran); the step logs no tokens, so the
        # report measures its curve in steps
        self.eval_only = self.kind == "base" and not spec.control.sample
        self.start_eval: dict | None = None

    def step(self, step: int) -> StepResult:
        started = time.perf_counter()
        if self.eval_only:
            return StepResult({"step": step, "time/step_s": 0.0, "time/elapsed_s": started - self.started})
        metrics = {"step": step, **(self.sample(step) if self.kind == "base" else self.supervised(step))}
        now = time.perf_counter()
        metrics.update({"time/step_s": now - started, "time/elapsed_s": now - self.started,
                        "perf/tokens_per_s": metrics["perf/completion_tokens"] / max(now - started, 1e-9)})
        return StepResult(metrics)

    def sample(self, step: int) -> dict:
        """Sample exactly as a GRPO step would, and change nothing."""
        self.model.eval()
        spec = self.spec
        batch = sample_groups(self.rollouts, TaskPrompts(self.task, spec.seed), spec.rollout.prompts_per_step,
                              spec.rollout.group_size, spec.tricks["sampling"], step,
                              float(spec.tricks["temperature"].values["value"]))
        lengths = batch.roll.lengths
        return {"reward/mean": batch.scores.mean().item(),
                "reward/std": batch.scores.std().item() if batch.scores.numel() > 1 else 0.0,
                "train/accuracy": batch.scores.mean().item(),
                "length/mean": lengths.float().mean().item(),
                "length/max": lengths.max().item(),
                "length/truncated_frac": batch.roll.truncated.float().mean().item(),
                "perf/completion_tokens": int(lengths.sum())}

    def supervised(self, step: int) -> dict:
        """The SFT budget: B x G solutions a step, or this step's share of control.wall_s."""
        spec, control = self.spec, self.spec.control
        B, G = spec.rollout.prompts_per_step, spec.rollout.group_size
        losses, norms, tokens, updates = [], [], 0, 0
        while True:
            problems = self.task.train_batch(B * G, spec.seed, step, updates)
            t0 = time.perf_counter()
            loss, norm, n_tokens = self.supervised_update(problems)
            self.trained_s += time.perf_counter() - t0
            losses.append(loss), norms.append(norm)
            tokens, updates = tokens + n_tokens, updates + 1
            if control.budget == "tokens" or self.trained_s >= float(control.wall_s) * step / spec.schedule.steps:
                break
        return {"loss": sum(losses) / len(losses), "optim/grad_norm": norms[-1],
                "optim/lr": self.optim.schedule.get_last_lr()[0], "perf/completion_tokens": tokens}

    def supervised_update(self, problems) -> tuple[float, float, int]:
        """One AdamW step on the reference solutions (mean NLL of solution tokens + EOS)."""
        self.model.train()
        ids, mask, labels = supervised_batch(self.tokenizer, [self.encode(p) for p in problems],
                                             [p.solution for p in problems], self.device)
        loss = self.model(input_ids=ids, attention_mask=mask, labels=labels).loss
        self.optim.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.optim.max_grad_norm)
        self.optim.optimizer.step()
        self.optim.schedule.step()
        return loss.item(), grad_norm.item(), int((labels != -100).sum())

    def evaluate(self) -> dict:
        if self.eval_only and self.start_eval is not None:   # the same weights, greedy: the same eval
            return dict(self.start_eval)
        result = evaluate(self.model, self.rollouts, self.eval_problems, self.spec.schedule.eval_max_new_tokens)
        if self.eval_only:
            self.start_eval = dict(result)
        return result

    def state_dict(self) -> dict:
        return {**self.optim.state_dict(), "trained_s": self.trained_s}

    def checkpoint_weights(self) -> None:
        return None     # one process, the model whole: its own state_dict

    def load_state_dict(self, state: dict) -> None:
        self.optim.load_state_dict(state)
        self.trained_s = state["trained_s"]
