"""Control runs: what happens without RL, from the same start, on the same eval schedule.

control=base (the start, never updated), control=sft (supervised on the reference solutions,
budget `tokens` or `wall`), control=rft (a supervised step on the verified-correct samples): each
an ordinary run in train/run.py's skeleton, with a GRPO run's run-dir contract and metric keys.
Design: docs/controls.md#what-each-control-does-step-by-step
"""
from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

import torch
from omegaconf import DictConfig

from grpo_ablate.config.validate import validate
from grpo_ablate.errors import ConfigError
from grpo_ablate.models import (add_lora, disable_dropout, load_model_and_tokenizer, model_device, model_dir,
                                started_from, stop_token_ids, supervised_batch, weights_digest)
from grpo_ablate.sampling.decode import Rollout, sampler_seed, select_rows
from grpo_ablate.sampling.engines import HFEngine, Rollouts
from grpo_ablate.sampling.prompts import PromptEncoder
from grpo_ablate.evals.score import evaluate
from grpo_ablate.tasks import build_task
from grpo_ablate.train.distributed import DataParallel
from grpo_ablate.config.resume_rules import already_finished, check_same_start, open_run_dir, threads_to_run
from grpo_ablate.config.spec import RunSpec, run_spec
from grpo_ablate.train.run import (Optimization, RunResult, StepResult, attention_implementation,
                                   finished_result, prepare_process, run_steps)
from grpo_ablate.rundir.lock import DirLock
from grpo_ablate.train.batch import SampledGroups, TaskPrompts, sample_groups
from grpo_ablate.train.forward import completion_logprobs

CORRECT = 1.0   # the verifier's score of a verified-correct completion (tasks/__init__.py): what RFT keeps


def run_control(cfg: DictConfig, run_dir: str | Path, overrides: list[str] = (), console=None) -> RunResult:
    run_dir = Path(run_dir)
    say = console.print if console is not None else (lambda *a, **k: None)
    validate(cfg)
    spec = run_spec(cfg)   # below, as in a GRPO run, only the spec travels (config/spec.py)
    if DataParallel().world > 1:
        raise ConfigError("control runs train in one process; launch control=base|sft|rft without torchrun")
    run_dir.mkdir(parents=True, exist_ok=True)
    with DirLock(run_dir, "run dir", say):   # one writer a run dir, as a GRPO run
        status, checkpoint = open_run_dir(cfg, run_dir)   # the same resume rules as a GRPO run
        if already_finished(status, cfg):
            return finished_result(status, run_dir, say)
        threads = prepare_process(threads_to_run(spec.threads, status, checkpoint), spec.seed)
        control = ControlStep(spec, model_device(cfg.model), checkpoint, say)
        check_same_start(status if checkpoint else None, control.start, run_dir)
        return run_steps(spec.schedule, spec.record, run_dir, overrides, control, checkpoint, console,
                         started_from=control.start, threads=threads)


class ControlStep:
    """The `Trainer` of a control run (train/run.py): sample and change nothing (base), one
    step's budget of supervised updates on reference solutions (sft), or one supervised step on
    the policy's own verified-correct samples (rft)."""

    def __init__(self, spec: RunSpec, device: torch.device, checkpoint: Path | None, say):
        self.spec, self.kind, self.device, self.say = spec, spec.control.name, device, say
        self.task = build_task(spec.task)
        if self.kind == "sft" and not getattr(self.task.train_batch(1, 0, 0)[0], "solution", None):
            raise ConfigError(f"control=sft trains on the task's reference solutions, and task={spec.task.name} "
                              "has none; use control=base")
        model_path = model_dir(spec.model.group, self.task, log=say)
        attn = attention_implementation(spec.model.attn_implementation, device)
        # with LoRA, as in a GRPO run: the base from model.path, the adapters from the checkpoint
        lora = spec.model.lora
        self.model, self.tokenizer = load_model_and_tokenizer(model_path if lora else checkpoint or model_path,
                                                              attn_implementation=attn)
        # what it started from, as a GRPO run records it (None: a resume that loads its checkpoint alone)
        self.start = (started_from(spec.model.group, model_path, weights_digest(self.model))
                      if lora or checkpoint is None else None)
        if spec.model.disable_dropout:   # as the GRPO runs it is compared with
            disable_dropout(self.model)
        self.model = self.model.to(device)
        if lora:   # the same trained parameters as the GRPO runs: the adapters only
            self.model = add_lora(self.model, spec.model.group, checkpoint)
        self.encode = PromptEncoder(self.tokenizer, self.task)   # the prompts exactly as a GRPO run sees them
        trained = [p for p in self.model.parameters() if p.requires_grad]
        stream_seed = sampler_seed(spec.seed, spec.rollout.stream_salt)   # the RFT control's samples, as GRPO's
        self.optim = Optimization(trained, spec.optim, stream_seed, spec.schedule.steps)
        self.rollouts = Rollouts(HFEngine(self.model, spec.rollout.lean_decoder), self.tokenizer, self.encode,
                                 self.task, DataParallel(), device, eos_id=stop_token_ids(self.model, self.tokenizer),
                                 max_new_tokens=spec.rollout.max_new_tokens, seed=stream_seed, rng="stream",
                                 stream=self.optim.rng, filters=spec.rollout.filters)
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
        act = {"base": self.sample, "sft": self.supervised, "rft": self.rejection_sampled}[self.kind]
        metrics = {"step": step, **act(step)}
        if not (math.isfinite(metrics.get("loss", 0.0)) and math.isfinite(metrics.get("optim/grad_norm", 0.0))):
            return StepResult(metrics, diverged=f"non-finite loss or grad norm at step {step}")   # a result, as in GRPO
        now = time.perf_counter()
        metrics.update({"time/step_s": now - started, "time/elapsed_s": now - self.started,
                        "perf/tokens_per_s": metrics["perf/completion_tokens"] / max(now - started, 1e-9)})
        return StepResult(metrics)

    def sample(self, step: int) -> dict:
        """Sample exactly as a GRPO step would, and change nothing."""
        return rollout_metrics(self.sample_groups(step))

    def sample_groups(self, step: int) -> SampledGroups:
        """B prompts x G completions of the current policy, as a GRPO step draws and scores them."""
        self.model.eval()
        spec = self.spec
        return sample_groups(self.rollouts, TaskPrompts(self.task, spec.seed), spec.rollout.prompts_per_step,
                             spec.rollout.group_size, spec.tricks["sampling"], step,
                             float(spec.tricks["temperature"].values["value"]))

    def rejection_sampled(self, step: int) -> dict:
        """RFT: sample as a GRPO step, keep the verified-correct completions, one supervised step on them."""
        batch = self.sample_groups(step)
        correct = (batch.scores == CORRECT).nonzero().squeeze(1)
        metrics = {**rollout_metrics(batch),
                   "perf/sampled_tokens": batch.sampled_tokens,          # generated: + trained = the compute axis
                   "rft/kept_frac": len(correct) / len(batch.scores)}   # verified correct: trained on
        if len(correct) == 0:   # nothing to imitate: no gradient step; the lr schedule moves on as a GRPO run's
            self.say(f"step {step}: no completion verified correct, no gradient step (rft/skipped)")
            with warnings.catch_warnings():   # torch warns when a schedule steps before its optimizer
                warnings.simplefilter("ignore", UserWarning)
                self.optim.schedule.step()
            return {**metrics, "rft/skipped": 1, "perf/completion_tokens": 0,
                    "optim/lr": self.optim.schedule.get_last_lr()[0]}
        kept = select_rows(batch.roll, correct.to(batch.roll.sequences.device))
        loss, grad_norm, tokens = self.nll_update(kept)
        return {**metrics, "rft/skipped": 0, "loss": loss, "optim/grad_norm": grad_norm,
                "optim/lr": self.optim.schedule.get_last_lr()[0], "perf/completion_tokens": tokens}

    def nll_update(self, kept: Rollout) -> tuple[float, float, int]:
        """One AdamW step on the kept completions: the mean NLL over their tokens (EOS included),
        at T = 1 over the whole vocabulary as the SFT control's (a filtering sampler's kept sets are not
        replayed: this is imitation, not a ratio); no advantage, no ratio, no KL."""
        self.model.train()
        logp, _ = completion_logprobs(self.model, kept, score_kept_sets=False)
        mask = kept.sampled_mask.to(logp.dtype)   # a multi-turn episode's tool replies are not imitated
        loss = -(logp * mask).sum() / mask.sum()
        return loss.item(), self.optimizer_step(loss), int(mask.sum())

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
        turns = getattr(self.task, "demonstration_turns", None)   # a multi-turn task: the tool's replies not imitated
        targets = [p.solution if turns is None else turns(p, None, 0.0) for p in problems]
        ids, mask, labels = supervised_batch(self.tokenizer, [self.encode(p) for p in problems], targets, self.device)
        loss = self.model(input_ids=ids, attention_mask=mask, labels=labels).loss
        return loss.item(), self.optimizer_step(loss), int((labels != -100).sum())

    def optimizer_step(self, loss: torch.Tensor) -> float:
        """Backward, clip, AdamW and the lr schedule, as every update of a GRPO run; the grad norm."""
        self.optim.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.optim.max_grad_norm)
        self.optim.optimizer.step()
        self.optim.schedule.step()
        return grad_norm.item()

    def evaluate(self, step: int) -> dict:
        if self.eval_only and self.spec.eval.greedy and self.start_eval is not None:   # the same weights, greedy:
            return dict(self.start_eval)                                                # the same eval
        result = evaluate(self.model, self.rollouts, self.eval_problems, self.spec.eval, seed=self.spec.seed,
                          step=step, max_new_tokens=self.spec.schedule.eval_max_new_tokens,
                          answer=getattr(self.task, "answer", None))
        if self.eval_only:   # sampled: the same weights drawn anew at each step, with the arms' draws of that step
            self.start_eval = dict(result)
        return result

    def state_dict(self) -> dict:
        return {**self.optim.state_dict(), "trained_s": self.trained_s}

    def checkpoint_weights(self) -> None:
        return None     # one process, the model whole: its own state_dict

    def load_state_dict(self, state: dict) -> None:
        self.optim.load_state_dict(state)
        self.trained_s = state["trained_s"]


def rollout_metrics(batch: SampledGroups) -> dict:
    """What a GRPO step logs of its sampled batch (the verifier's scores, unshaped, and the lengths)."""
    lengths = batch.roll.lengths
    return {"reward/mean": batch.scores.mean().item(),
            "reward/std": batch.scores.std().item() if batch.scores.numel() > 1 else 0.0,
            "train/accuracy": batch.scores.mean().item(),
            "length/mean": lengths.float().mean().item(),
            "length/max": lengths.max().item(),
            "length/truncated_frac": batch.roll.truncated.float().mean().item(),
            "perf/completion_tokens": int(lengths.sum())}
