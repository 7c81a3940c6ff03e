"""The run skeleton every kind of run shares: the GRPO loop and the no-RL controls.

A kind of run brings a `Trainer` (its models and its step); the skeleton owns everything
around the step: the run dir (fresh or resumed, only with the config it was started with),
the base evaluation at step 0, the eval / samples / checkpoint schedule, status.json on
success, divergence and failure, and the progress shown on the console.

    state = trainer.state_dict()             optimizer, schedule, rng and the trainer's own
    weights = trainer.checkpoint_weights()   the model's full weights (None: its own state_dict)
    result = trainer.step(step)              StepResult: metrics, or the reason it diverged
Under torchrun every process calls state_dict and checkpoint_weights (model.fsdp=true gathers
shards: a collective); rank 0 alone writes them.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from grpo_ablate.errors import ConfigError
from grpo_ablate.config.spec import OptimSettings, RunRecord, Schedule
from grpo_ablate.rundir.cores import cpu_threads
from grpo_ablate.rundir.stopping import how_it_ended
from grpo_ablate.train.run_log import RunLog, save_checkpoint, save_weights

# Exit codes of `grpo-ablate train`
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_DIVERGED = 0, 1, 2, 3


@dataclass
class RunResult:
    state: str             # completed | diverged | failed
    step: int
    run_dir: Path
    base_accuracy: float | None = None
    final_accuracy: float | None = None
    reason: str | None = None
    eval_label: str = "accuracy"   # what the accuracies are: accuracy (greedy) or avg@n (the eval protocol's)

    @property
    def exit_code(self) -> int:
        return {"completed": EXIT_OK, "diverged": EXIT_DIVERGED}.get(self.state, EXIT_FAILED)


@dataclass
class StepResult:
    metrics: dict | None                 # this step's row of metrics.jsonl (None: nothing to log)
    diverged: str | None = None          # why the run diverged here: it stops, and that is a result
    samples: list[dict] = field(default_factory=list)   # a few completions, for samples.jsonl


class Trainer(Protocol):
    """What a kind of run brings to the skeleton."""
    model: torch.nn.Module       # saved with the tokenizer in every checkpoint
    tokenizer: object

    def evaluate(self, step: int) -> dict: ...   # evals/score.py: the eval of the policy at `step`
    def step(self, step: int) -> StepResult: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...
    def checkpoint_weights(self) -> dict | None: ...


# ------------------------------------------------------------------------------ set-up
def prepare_process(threads: int | None, seed: int) -> int:
    """Process-wide settings every run makes before it builds anything (the seed first). Returns the
    torch threads it set: `threads`, else the cores nobody else is using (rundir/cores.py)."""
    torch.set_flush_denormal(True)   # near-converged tiny models produce denormals: ~100x slower on CPUs
    torch.set_num_threads(cpu_threads(threads))
    torch.manual_seed(seed)
    return torch.get_num_threads()


def attention_implementation(attn: str | None, device: torch.device) -> str | None:
    """model.attn_implementation, with `auto` = eager on a CPU (it beats SDPA's dispatch
    overhead for tiny models, ~8% per step) and transformers' default elsewhere."""
    return ("eager" if device.type == "cpu" else None) if attn == "auto" else attn


def lr_factor(step: int, warmup_steps: int, steps: int, schedule: str) -> float:
    """The lr multiplier of rollout `step` (0-based): a linear warm-up over `warmup_steps`, then
    `schedule` - constant, or a linear or cosine decay from the peak to 0 at `steps` (Hugging Face's
    get_linear_schedule_with_warmup / get_cosine_schedule_with_warmup; TRL's GRPOTrainer decays
    linearly by default). A decayed run's last steps move the policy little, so its late evals,
    which a sweep's summary averages, settle instead of drifting."""
    warmup = max(1, warmup_steps)
    if step < warmup_steps or schedule == "constant":
        return min(1.0, (step + 1) / warmup)
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return max(0.0, 1.0 - progress) if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


class Optimization:
    """AdamW with the warm-up and decay every kind of run uses (`lr_factor`), and the run's random
    stream (`rng`: sampling, shuffles, seeded draws): everything a checkpoint needs besides the
    weights and the trainer's own state."""

    def __init__(self, param_groups: list, optim: OptimSettings, seed: int, steps: int):
        self.optimizer = torch.optim.AdamW(param_groups, lr=optim.lr, betas=optim.betas,
                                           weight_decay=optim.weight_decay)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, optim.warmup_steps, steps, optim.schedule))
        self.horizon = {"lr_schedule": optim.schedule, "lr_horizon": steps}   # what a resume with other steps changes
        self.rng = torch.Generator().manual_seed(seed)   # the only randomness of a step

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "schedule": self.schedule.state_dict(),
                "sampler": self.rng.get_state(),   # "sampler": the key older checkpoints were written with
                **self.horizon}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        self.rng.set_state(state["sampler"])


def finished_result(status: dict, run_dir: Path, say) -> RunResult:
    say(f"{run_dir} is already {status['state']} at step {status['step']}; nothing to do")
    return RunResult(status["state"], status["step"], run_dir, reason=status.get("reason"))


# ------------------------------------------------------------------------------ the loop
def record_step(schedule: Schedule, run_dir: Path, trainer: Trainer, log, step: int, outcome: StepResult,
                writes: bool) -> dict:
    """A finished step on the schedule: its eval (every eval.every steps and the last), its metrics,
    its samples, its checkpoint (every checkpoint_every steps and the last), then status.json."""
    metrics, last = outcome.metrics, step == schedule.steps
    evals = step % schedule.eval_every == 0 or last
    if evals:
        eval_started = time.perf_counter()
        metrics.update(trainer.evaluate(step))
        metrics["time/eval_s"] = time.perf_counter() - eval_started
    log.log(metrics)
    if step % schedule.samples_every == 0 and outcome.samples:
        log.samples(step, outcome.samples)
    kept = evals and schedule.keep_weights and not last   # the last step's weights are its checkpoint's
    weights = trainer.checkpoint_weights() if kept else None   # every process (FSDP gathers)
    if kept and writes:
        save_weights(run_dir, step, trainer.model, trainer.tokenizer, weights)
    if step % schedule.checkpoint_every == 0 or last:   # every process (FSDP gathers)
        state = {"step": step, **trainer.state_dict()}
        weights = weights if kept else trainer.checkpoint_weights()
        if writes:
            save_checkpoint(run_dir, trainer.model, trainer.tokenizer, state, weights)
    log.status("running", step)
    return metrics


# said once, at a run's first step, where the sampler's filters left one token at every position
GREEDY_SAMPLER = ("[yellow]warning[/]: the sampler's filters (rollout.top_k, top_p, min_p) kept a single token at "
                  "every sampled position of this step: it samples greedily, every completion of a group is the same "
                  "and no advantage is nonzero, so the run learns nothing from the reward; loosen the filters")


def run_steps(schedule: Schedule, record: RunRecord, run_dir: Path, overrides, trainer: Trainer,
              checkpoint: Path | None, console=None, writes: bool = True, first_row: dict | None = None,
              started_from: dict | None = None, threads: int | None = None) -> RunResult:
    """Steps start+1 .. schedule.steps of `trainer` in `run_dir`, with the eval, samples and
    checkpoint schedule; status.json says how it ended (and config.yaml what it ran: `record`;
    what it started from: `started_from`, models.started_from's record; its torch `threads`).
    `writes`: this process writes the run dir (under torchrun, rank 0 alone). `first_row` joins
    the metrics of step 0."""
    say = console.print if console is not None else (lambda *a, **k: None)
    start = 0
    if checkpoint is not None:
        state = load_trainer_state(checkpoint, run_dir)
        trainer.load_state_dict(state)
        start = state["step"]
        say(f"resuming {run_dir} from step {start}")
        horizon = state.get("lr_horizon")
        if state.get("lr_schedule", "constant") != "constant" and horizon not in (None, schedule.steps):
            say(f"note: optim.schedule={state['lr_schedule']} decays the lr to 0 at the run's last step, which was "
                f"{horizon} and is now {schedule.steps}: from step {start} on the lr follows the new horizon, so "
                f"this run is not the one a {schedule.steps}-step run from the start would be")
    log = RunLog(run_dir, record, list(overrides), resume_step=start if checkpoint is not None else None,
                 started_from=started_from, threads=threads) if writes else Silent()
    result, step, progress = RunResult("running", start, run_dir), start, None
    steps = schedule.steps
    try:
        if start == 0:
            base = trainer.evaluate(0)
            log.log({"step": 0, **base, **(first_row or {})})
            result.base_accuracy = base["eval/accuracy"]
            say(f"step 0  base eval {schedule.eval_label} {base['eval/accuracy']:.3f}{widest_pass(base)}")
        progress = ProgressLine(console, steps, start, schedule.eval_label)
        metrics: dict = {}
        for step in range(start + 1, steps + 1):
            if step == schedule.fail_at_step:   # fault injection (tests of sweep isolation)
                raise RuntimeError(f"debug.fail_at_step={step}: injected failure")
            outcome = trainer.step(step)
            if outcome.diverged is not None:     # for an ablation a NaN is a result: record it, stop
                if outcome.metrics is not None:
                    log.log(outcome.metrics)
                log.status("diverged", step, outcome.diverged)
                say(f"[red]diverged[/]: {outcome.diverged}")
                result.state, result.step, result.reason = "diverged", step, outcome.diverged
                return result
            metrics = record_step(schedule, run_dir, trainer, log, step, outcome, writes)
            if step == start + 1 and metrics.get("rollout/one_token_frac") == 1.0:
                say(GREEDY_SAMPLER)
            progress.update(step, metrics, say)
        result.state, result.step, result.eval_label = "completed", steps, schedule.eval_label
        result.final_accuracy = metrics.get("eval/accuracy") if steps > start else None
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


def load_trainer_state(checkpoint: Path, run_dir: Path) -> dict:
    """trainer_state.pt, or one line saying it is damaged and what to do."""
    try:
        state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
    except Exception as err:   # a cut-off or foreign file: torch raises many kinds
        raise ConfigError(f"run dir {run_dir}: {checkpoint.name}/trainer_state.pt cannot be loaded "
                          f"({type(err).__name__}); start it over with `grpo-ablate train --resume {run_dir} "
                          "--restart`") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise ConfigError(f"run dir {run_dir}: {checkpoint.name}/trainer_state.pt holds no trainer state; start "
                          f"it over with `grpo-ablate train --resume {run_dir} --restart`")
    return state


class Silent:
    """The run log of a rank other than 0 under torchrun: rank 0 alone writes the run dir."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def widest_pass(metrics: dict) -> str:
    """'  pass@8 0.934': the largest pass@k an eval logged (a sampled eval), '' for none."""
    ks = [int(key.rsplit("@", 1)[1]) for key in metrics if key.startswith("eval/pass@")]
    return f"  pass@{max(ks)} {metrics[f'eval/pass@{max(ks)}']:.3f}" if ks else ""


class ProgressLine:
    """A rich progress bar (step, reward, accuracy) on a terminal; a line per eval otherwise."""

    def __init__(self, console, total: int, done: int, label: str = "accuracy"):
        self.bar, self.label = None, "acc" if label == "accuracy" else label
        if console is not None and console.is_terminal:
            self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console)
            self.task = self.bar.add_task("train", total=total, completed=done, info="")
            self.bar.start()

    def update(self, step: int, metrics: dict, say) -> None:
        info = (f"reward {metrics['reward/mean']:.3f}  len {metrics['length/mean']:.1f}" if "reward/mean" in metrics
                else f"sft loss {metrics['loss']:.3f}" if "loss" in metrics   # a supervised control samples nothing
                else "no training")                                           # an eval-only base control
        if "eval/accuracy" in metrics:
            info += f"  eval {self.label} {metrics['eval/accuracy']:.3f}{widest_pass(metrics)}"
            if self.bar is None:
                say(f"step {step}  {info}  ({metrics['time/step_s']:.2f} s/step)")
            else:
                self.bar.console.print(f"step {step}  {info}")
        if self.bar is not None:
            self.bar.update(self.task, completed=step, info=info)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
