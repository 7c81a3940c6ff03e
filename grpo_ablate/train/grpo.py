"""The one training loop: rollout -> reward -> advantage -> loss -> step.

Read `train` top to bottom. Every trick enters through a registry looked up by the name its
config group chose (cfg.adv.name, cfg.clip.name, cfg.loss_agg.name, cfg.kl.name/estimator);
this file never branches on a trick's name.
"""
from __future__ import annotations

import copy
import math
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from grpo_ablate.train import diagnostics
from grpo_ablate.config import ConfigError, check_here, config_hash, trick, validate
from grpo_ablate.train.distributed import DataParallel
from grpo_ablate.sampling.engines import Rollouts, build_engine, rng_mode
from grpo_ablate.sampling.prompts import PromptEncoder
from grpo_ablate.models import (AdapterDisabled, add_lora, autocast_forward, enable_activation_checkpointing,
                                ensure_warm_started, load_model_and_tokenizer, lora_enabled, model_device,
                                stop_token_ids)
from grpo_ablate.sampling.decode import NonFiniteLogits, Rollout, completion_logprobs, concat_rollouts, select_rows
from grpo_ablate.tasks import build_task
from grpo_ablate.rundir import find_checkpoint, read_status
from grpo_ablate.train.run_log import RunLog, save_checkpoint
from grpo_ablate.tricks import option
from grpo_ablate.tricks.adv import gae, group_mean_std, token_rewards
from grpo_ablate.tricks.kl import k1, k3, kl_reward_penalty
from grpo_ablate.tricks.loss_agg import aggregate, masked_mean
from grpo_ablate.tricks.value import explained_variance

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

    @property
    def exit_code(self) -> int:
        return {"completed": EXIT_OK, "diverged": EXIT_DIVERGED}.get(self.state, EXIT_FAILED)


def train(cfg: DictConfig, run_dir: str | Path, overrides: list[str] = (), console=None) -> RunResult:
    validate(cfg)
    check_here(cfg)     # packages, GPU, offline hub, torchrun's processes: where the run runs
    # torchrun: one process per device, each training on its part of the batch (distributed.py);
    # rank 0 alone writes the run dir (Hydra made it there) and talks to the console.
    dp = DataParallel()
    device = model_device(cfg.model, dp.local_rank)   # model.device: the GPU if any (the tiny model: CPU)
    dp.start(device)
    run_dir = Path(dp.broadcast(str(run_dir)))
    console = console if dp.is_main else None
    say = console.print if console is not None else (lambda *a, **k: None)
    # Near-converged tiny models produce denormal floats, which run ~100x slower on CPUs.
    torch.set_flush_denormal(True)
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    torch.manual_seed(cfg.seed)
    B, G = int(cfg.rollout.prompts_per_step), int(cfg.rollout.group_size)
    max_new = int(cfg.rollout.max_new_tokens)

    # --- resume or fresh start -------------------------------------------------------------
    status, checkpoint = open_run_dir(cfg, run_dir)
    if already_finished(status, cfg):
        say(f"[bold]{run_dir}[/] is already {status['state']} at step {status['step']}; nothing to do")
        return RunResult(status["state"], status["step"], run_dir, reason=status.get("reason"))

    # --- task, policy, reference -------------------------------------------------------------
    task = build_task(cfg.task)
    model_path = cfg.model.path or dp.main_first(lambda: ensure_warm_started(cfg.model, task, log=say))
    # Tiny models on a CPU: eager attention beats SDPA's dispatch overhead (~8% per step).
    attn = cfg.model.attn_implementation
    attn = ("eager" if device.type == "cpu" else None) if attn == "auto" else attn
    dtype = cfg.model.get("dtype", "float32")     # compute dtype; weights stay float32
    lora = lora_enabled(cfg.model)                 # model.lora.r > 0: train LoRA adapters only

    def load(path):   # on the device; with model.dtype != float32 the forward runs under autocast
        model, tok = load_model_and_tokenizer(path, attn_implementation=attn)
        return autocast_forward(model.to(device), dtype), tok

    # With LoRA the base comes from model.path and the adapters from the checkpoint (on resume).
    policy, tokenizer = load(model_path if lora else checkpoint or model_path)
    if cfg.model.get("gradient_checkpointing"):   # recompute activations in backward: less memory
        enable_activation_checkpointing(policy)
    if lora:
        policy = add_lora(policy, cfg.model, checkpoint)
    encode = PromptEncoder(tokenizer, task)          # problem -> prompt ids (chat template if any)
    prompt_counts = encode.drop_long_prompts(task, say)   # task.max_prompt_tokens: drop longer ones
    format_reward = float(getattr(task, "format_reward", 0.0))   # bonus for \boxed{} / #### answers
    kl_control = trick(cfg, "kl")()
    kl_estimator = option("kl.estimator", cfg.kl.estimator).impl
    kl_weight_fn = trick(cfg, "kl_weight")
    # The reference policy is the starting model, frozen. It is loaded and run only when a KL
    # term or a KL metric uses it: with beta = 0 there is no second model and no extra forward.
    needs_reference = kl_control.beta > 0 or bool(cfg.metrics.ref_kl)
    reference = None
    if needs_reference and lora:   # the base model is the policy with its adapters off: no copy
        reference = AdapterDisabled(policy)
    elif needs_reference:
        reference = load(model_path)[0] if checkpoint else copy.deepcopy(policy)
        reference.eval().requires_grad_(False)
    # A second anchor, the policy as it was prev_lag optimizer steps ago (two-layer KL): a
    # frozen copy that is refreshed from the last prev_lag + 1 weight snapshots each step.
    previous, snapshots = None, deque(maxlen=kl_control.prev_lag + 1)
    if kl_control.beta_prev > 0:
        previous = copy.deepcopy(policy).eval().requires_grad_(False)
        snapshots.append(_weights(policy))
    entropy_control = trick(cfg, "entropy")()
    overlong_fn = trick(cfg, "overlong")
    length_fn = trick(cfg, "length")
    reward_norm_fn = trick(cfg, "reward_norm")
    estimator = option("adv", cfg.adv.name)
    advantage_fn = trick(cfg, "adv")
    # A critic (adv=gae): a value head on the policy's last hidden state, trained alongside it.
    value_head = torch.nn.Linear(policy.config.hidden_size, 1).to(device) if estimator.uses_values else None
    value_loss_fn = trick(cfg, "value_clip")
    adv_clip_fn = trick(cfg, "adv_clip")
    policy_loss_fn = trick(cfg, "clip", dual_clip_c=cfg.dual_clip.c)

    temperature = trick(cfg, "temperature")()
    critic = list(value_head.parameters()) if value_head is not None else []
    trained = [p for p in policy.parameters() if p.requires_grad] + critic   # LoRA: the adapters only
    # trained tensors outside the policy, whose gradients DDP does not average (torchrun)
    outside_ddp = critic + [p for group in temperature.param_groups() for p in group["params"]]
    # Gradient-conflict diagnostics (diag.grad_conflict=true): every diag.every steps, see 2b.
    # Off, diag_every is 0 and a step pays one integer test for them.
    diag_every = int(cfg.diag.every) if cfg.diag.grad_conflict else 0
    diag_params = diagnostics.last_layer_params(policy, cfg.diag.last_layers) if diag_every else None
    optimizer = torch.optim.AdamW([{"params": trained}, *temperature.param_groups()],
                                  lr=cfg.optim.lr, betas=tuple(cfg.optim.betas),
                                  weight_decay=cfg.optim.weight_decay)
    warmup = max(1, int(cfg.optim.warmup_steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    sampler = torch.Generator().manual_seed(int(cfg.seed))  # the only randomness of a step
    # Sampling (rollout.backend: the policy itself, or vLLM), decoding, scoring: the whole batch.
    engine = build_engine(cfg, policy, tokenizer, dp)
    rollouts = Rollouts(engine, tokenizer, encode, task, dp, device, eos_id=stop_token_ids(policy, tokenizer),
                        max_new_tokens=max_new, seed=int(cfg.seed), rng=rng_mode(cfg, dp), stream=sampler)
    train_model = dp.wrap(policy)   # the loss's forward: DDP under torchrun (gradients averaged)
    # model.dtype=float16: a dynamic loss scale keeps small gradients from underflowing (else off)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == "float16")
    # tricks with state of their own (adaptive coefficients, a learnable T): checkpointed
    controllers = {"kl_control": kl_control, "entropy_control": entropy_control, "temperature": temperature,
                   **({"value_head": value_head} if value_head is not None else {}),
                   **({"grad_scaler": scaler} if scaler.is_enabled() else {})}
    start_step, skipped_steps = 0, 0
    if checkpoint is not None:
        state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        sampler.set_state(state["sampler"])
        for name, controller in controllers.items():
            controller.load_state_dict(state[name])
        snapshots.extend(state["snapshots"])
        start_step, skipped_steps = state["step"], state["skipped_steps"]
        say(f"resuming {run_dir} from step {start_step}")

    log = (RunLog(run_dir, cfg, list(overrides), config_hash(cfg),
                  resume_step=start_step if checkpoint is not None else None) if dp.is_main else _Silent())
    eval_problems = task.eval_set()

    def evaluate_now() -> dict:
        return evaluate(policy, rollouts, eval_problems, int(cfg.eval.max_new_tokens))

    run_started = time.perf_counter()
    result = RunResult("running", start_step, run_dir)
    step, progress = start_step, None

    def diverged(reason: str, metrics: dict | None = None) -> RunResult:
        """For an ablation a NaN is a result: record the step and stop, do not crash."""
        if metrics is not None:
            log.log(metrics)
        log.status("diverged", step, reason)
        say(f"[red]diverged[/]: {reason}")
        result.state, result.step, result.reason = "diverged", step, reason
        return result

    try:
        if start_step == 0:
            base = evaluate_now()
            log.log({"step": 0, **base, **prompt_counts})
            result.base_accuracy = base["eval/accuracy"]
            say(f"step 0  base eval accuracy {base['eval/accuracy']:.3f}")
        progress = _progress(console, cfg.steps, start_step)
        for step in range(start_step + 1, int(cfg.steps) + 1):
            step_started = time.perf_counter()
            policy.train()
            if step == cfg.debug.fail_at_step:   # fault injection (tests of sweep isolation)
                raise RuntimeError(f"debug.fail_at_step={step}: injected failure")

            # 1. Rollout: B prompts x G completions at temperature T with the KV cache, scored
            #    by the verifier; the sampling family decides which groups make the batch.
            T = temperature.value                           # this step's sampling temperature
            try:
                batch = sample_groups(rollouts, task, cfg, step, T)
            except NonFiniteLogits as err:
                return diverged(f"{err} at step {step}")
            roll, problems, texts, group_index = batch.roll, batch.problems, batch.texts, batch.group_index
            task_rewards, n_groups, rounds = batch.scores.to(device), len(batch.problems), batch.rounds
            group_index = group_index.to(device)       # (no-ops on a CPU)
            # The forward passes run on this rank's rows (all of them without torchrun); what
            # they compute is gathered back to the whole batch, where steps 2 and 4 work.
            part, my = select_rows(roll, dp.share(len(texts))), dp.part
            sampled = time.perf_counter()

            # pi_ref log-probs (frozen start) only when a KL term or metric needs them; pi_old
            # log-probs (and V_old) by a separate forward only with several updates per rollout,
            # a KL penalty in the reward or a critic; otherwise pi_old == pi_theta and the ratio
            # is exactly 1 (nothing clips: expected); pi_prev only for the two-layer KL.
            with torch.no_grad():
                ref_logp = dp.gather_rows(completion_logprobs(reference, part, T)[0]) if reference is not None else None
                old_logp = old_values = None
                if int(cfg.updates.num_iterations) > 1 or kl_control.reward_beta > 0 or value_head is not None:
                    old_logp, _, hidden = completion_logprobs(policy, part, T, return_hidden=True)
                    old_values = value_head(hidden).squeeze(-1) if value_head is not None else None
                    old_logp, old_values = dp.gather_rows(old_logp), dp.gather_rows(old_values)
                prev_logp = None
                if previous is not None:
                    previous.load_state_dict(snapshots[0])
                    prev_logp = dp.gather_rows(completion_logprobs(previous, part, T)[0])
            scored = time.perf_counter()

            # 2. Rewards from the verifier, shaped (overlong, length, KL in the reward,
            #    reward_norm); group-relative advantages, one per completion (then adv_clip).
            # the reward scale: the verifier's score mapped to [reward.wrong, reward.correct]
            scaled_task_reward = cfg.reward.wrong + (cfg.reward.correct - cfg.reward.wrong) * task_rewards
            rewards = scaled_task_reward
            if format_reward:   # task.format_reward: a bonus for a final answer in \boxed{} or after ####
                rewards = rewards + format_reward * torch.tensor([float(task.formatted(t)) for t in texts],
                                                                 device=device)
            rewards, keep, overlong_penalty = overlong_fn(rewards, roll.lengths, roll.truncated,
                                                          max_new)
            mask = roll.completion_mask * keep[:, None]   # [N, L] 1 up to and incl. EOS, if trained
            rewards, length_reward = length_fn(rewards, roll.lengths, group_index, task_rewards > 0,
                                               max_new)
            if kl_control.reward_beta > 0:
                rewards = rewards - kl_control.reward_beta * kl_reward_penalty(old_logp, ref_logp, mask)
            rewards = reward_norm_fn(rewards)
            advantages = advantage_fn(rewards, group_index, mask, old_values, {})
            advantages, adv_clipped_frac = adv_clip_fn(advantages)
            token_advantages = advantages if advantages.dim() == 2 else advantages[:, None]
            if value_head is not None:  # the critic's targets: lambda-returns under V_old
                returns = gae(token_rewards(rewards, mask), old_values, mask,
                              float(cfg.adv.gamma), float(cfg.adv.lam))[1]
            weights = option("loss_agg", cfg.loss_agg.name).impl(mask, max_new)  # loss = sum w * l
            rewarded = time.perf_counter()

            # 2b. Gradient-conflict diagnostics (every diag.every steps when diag.grad_conflict).
            #     On a sub-batch (diag.rows completions) and this step's weights: the gradient,
            #     w.r.t. the last diag.last_layers blocks, of each loss term alone and of the
            #     policy term driven by each reward component alone (that component through the
            #     same reward_norm -> adv -> adv_clip). Logs grad_norm/<term>, grad_cos/<a>__<b>.
            #     Observation only: autograd.grad accumulates nothing into .grad and the RNG is
            #     restored, so the update below is exactly the one it is with diagnostics off.
            diag_metrics = {}
            if diag_every and step % diag_every == 0:
                diag_started = time.perf_counter()
                components = {"task_reward": scaled_task_reward,
                              "overlong_reward": overlong_penalty, "length_reward": length_reward}
                if kl_control.reward_beta > 0:
                    components["kl_reward"] = -kl_control.reward_beta * kl_reward_penalty(old_logp, ref_logp, mask)

                def advantage_of(component):
                    component = reward_norm_fn(component)
                    return adv_clip_fn(advantage_fn(component, group_index, mask, None, {}))[0]
                # a critic's baseline is for the whole reward: no per-component split with one
                component_adv = ({} if estimator.uses_values
                                 else diagnostics.component_advantages(components, advantage_of))
                informative = torch.stack([token_advantages.flatten(1).ne(0).any(1),
                                           *(a.ne(0) for a in component_adv.values())]).any(0)
                rows = diagnostics.pick_rows(group_index, informative, cfg.diag.rows)
                with torch.random.fork_rng(devices=[policy.device] if policy.device.type == "cuda" else []):
                    logp_d, entropy_d, *hidden_d = completion_logprobs(
                        policy, select_rows(roll, rows), temperature.current(),
                        entropy_grad=entropy_control.coef > 0, return_hidden=value_head is not None)
                w = weights[rows] * (weights.sum() / weights[rows].sum().clamp(min=1e-12))  # full loss's total
                old_d = logp_d.detach() if old_logp is None else old_logp[rows]

                def policy_term(adv):
                    return aggregate(policy_loss_fn(logp_d, old_d, adv, mask[rows])[0], w)
                terms = {"policy": policy_term(token_advantages[rows])}     # as in step 3's loss
                if value_head is not None:
                    terms["value"] = aggregate(float(cfg.adv.value_coef) * value_loss_fn(
                        value_head(hidden_d[0]).squeeze(-1), old_values[rows], returns[rows]), w)
                if ref_logp is not None and kl_control.loss_beta > 0:
                    terms["kl"] = aggregate(kl_control.loss_beta * kl_estimator(logp_d, ref_logp[rows], old_d)
                                            * kl_weight_fn(mask[rows], entropy_d), w)
                if prev_logp is not None:
                    terms["kl_prev"] = aggregate(kl_control.beta_prev * kl_estimator(logp_d, prev_logp[rows], old_d), w)
                if entropy_control.coef > 0:
                    terms["entropy"] = aggregate(-entropy_control.coef * entropy_d, w)
                terms.update({name: policy_term(adv[rows][:, None]) for name, adv in component_adv.items()})
                diag_metrics = diagnostics.conflict_metrics(diagnostics.term_gradients(terms, diag_params))
                diag_metrics["time/diag_s"] = time.perf_counter() - diag_started  # part of time/update_s

            # 3. Policy update(s): clipped surrogate + beta * KL - c * entropy, aggregated,
            #    grad-norm clipped, AdamW. The entropy carries a gradient only when c > 0.
            #    On this rank's rows (`my`: a whole-batch tensor's rows for this rank).
            entropy_coef = entropy_control.coef
            for _ in range(int(cfg.updates.num_iterations)):
                # T enters the graph: a learnable temperature is trained through the policy loss
                logp, entropy, *hidden = completion_logprobs(train_model, part, temperature.current(),
                                                             entropy_grad=entropy_coef > 0,
                                                             return_hidden=value_head is not None)
                old = logp.detach() if old_logp is None else my(old_logp)
                pg_loss, clip_stats = policy_loss_fn(logp, old, my(token_advantages), my(mask))
                token_loss = pg_loss
                if value_head is not None:
                    values = value_head(hidden[0]).squeeze(-1)
                    value_loss = value_loss_fn(values, my(old_values), my(returns))
                    token_loss = token_loss + float(cfg.adv.value_coef) * value_loss
                if ref_logp is not None:
                    kl_token = kl_estimator(logp, my(ref_logp), old) * kl_weight_fn(my(mask), entropy)
                    token_loss = token_loss + kl_control.loss_beta * kl_token
                if prev_logp is not None:
                    token_loss = token_loss + kl_control.beta_prev * kl_estimator(logp, my(prev_logp), old)
                if entropy_coef > 0:
                    token_loss = token_loss - entropy_coef * entropy
                loss = aggregate(token_loss, my(weights))    # weights are global: the ranks' losses add up
                if step == cfg.debug.nan_loss_at_step:   # fault injection: a divergence
                    loss = loss * float("nan")
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss * dp.world).backward()     # DDP averages over ranks: x world = the sum
                dp.average_grads(outside_ddp)                 # a value head, a learnable T (torchrun only)
                scaler.unscale_(optimizer)          # float16 only: the true gradients, before clipping
                grad_norm = torch.nn.utils.clip_grad_norm_(trained, cfg.optim.max_grad_norm)
                step_loss = dp.sum(loss.item())     # the whole batch's loss
                # (float16: an overflowing gradient is routine; the scaler skips it, lowers its scale)
                finite = math.isfinite(step_loss) and (math.isfinite(grad_norm.item()) or scaler.is_enabled())
                if not finite and cfg.on_nonfinite == "skip":
                    skipped_steps += 1  # drop this update, keep the weights as they were
                    optimizer.zero_grad(set_to_none=True)
                    scaler.update()
                    continue
                if not finite:
                    break
                scaler.step(optimizer)              # optimizer.step(), unless float16 overflowed
                scaler.update()
                schedule.step()
            if previous is not None:
                snapshots.append(_weights(policy))
            engine.sync(policy)     # rollout=vllm: the sampler gets the new weights (hf: nothing to do)
            # the update's per-token results, for the metrics: back to the whole batch (torchrun)
            logp, entropy = dp.gather_rows(logp), dp.gather_rows(entropy)
            clip_stats = {k: dp.gather_rows(v) for k, v in clip_stats.items()}
            if value_head is not None:
                values, value_loss = dp.gather_rows(values), dp.gather_rows(value_loss)
            updated = time.perf_counter()

            # 4. Metrics of this step (token means over completion tokens unless stated).
            with torch.no_grad():
                _, group_std = group_mean_std(rewards, group_index)
                # per completion, or per trained token for a token-level estimator (gae)
                adv_values = advantages[mask.bool()] if advantages.dim() == 2 else advantages
                lengths = roll.lengths
                metrics = {
                    "step": step,
                    "loss": step_loss,
                    "reward/mean": rewards.mean().item(),
                    "reward/std": rewards.std().item() if rewards.numel() > 1 else 0.0,
                    "train/accuracy": task_rewards.mean().item(),  # the verifier's 0/1, unshaped
                    "overlong/penalty_mean": overlong_penalty.mean().item(),
                    "overlong/masked_frac": (~keep).float().mean().item(),
                    "length/reward_mean": length_reward.mean().item(),
                    "sampling/rounds": rounds,
                    "sampling/kept_group_frac": n_groups / (rounds * B),
                    "sampling/extra_generations": (rounds - 1) * B * G + len(texts) - n_groups * G,
                    "sampling/mean_group_size": len(texts) / n_groups,
                    "entropy/coef": entropy_coef,
                    "temperature/value": T,
                    "adv/clipped_frac": adv_clipped_frac.item(),
                    "length/mean": lengths.mean().item(),
                    "length/max": lengths.max().item(),
                    "length/truncated_frac": roll.truncated.float().mean().item(),
                    "policy/entropy": masked_mean(entropy, mask).item(),
                    "adv/mean": adv_values.mean().item(),
                    "adv/std": adv_values.std().item() if adv_values.numel() > 1 else 0.0,
                    "adv/min": adv_values.min().item() if adv_values.numel() else 0.0,
                    "adv/max": adv_values.max().item() if adv_values.numel() else 0.0,
                    "adv/zero_std_group_frac": torch.zeros(n_groups, device=device).index_fill_(
                        0, group_index[group_std == 0], 1.0).mean().item(),
                    "kl/beta": kl_control.beta,
                    "optim/grad_norm": grad_norm.item(),
                    "optim/lr": schedule.get_last_lr()[0],
                    "optim/skipped_steps": skipped_steps,
                    **{k: masked_mean(v, mask).item() for k, v in clip_stats.items()},
                    **diag_metrics,
                }
                if ref_logp is not None:
                    metrics["kl/k1"] = masked_mean(k1(logp, ref_logp), mask).item()
                    metrics["kl/k3"] = masked_mean(k3(logp, ref_logp), mask).item()
                    kl_control.update(metrics["kl/k3"], num_sequences=rewards.numel())
                if value_head is not None:
                    metrics["value/loss"] = masked_mean(value_loss, mask).item()
                    metrics["value/explained_variance"] = explained_variance(values, returns, mask).item()
                if prev_logp is not None:
                    metrics["kl/prev_k3"] = masked_mean(k3(logp, prev_logp), mask).item()
                if roll.sampler_logprobs is not None and cfg.rollout.backend == "vllm":   # sampler vs our log-probs
                    gap = (roll.sampler_logprobs - (old_logp if old_logp is not None else logp)).abs() * mask
                    metrics["rollout/logprob_gap_mean"] = (gap.sum() / mask.sum().clamp(min=1)).item()
                    metrics["rollout/logprob_gap_max"] = gap.max().item()
                entropy_control.update(metrics["policy/entropy"])
                completion_tokens = mask.sum().item()
                metrics.update({
                    "time/sample_s": sampled - step_started,   # generation and verifier
                    "time/reference_s": scored - sampled,    # pi_ref (and pi_old) forwards
                    "time/reward_s": rewarded - scored,
                    "time/update_s": updated - rewarded,
                    "time/step_s": updated - step_started,
                    "time/elapsed_s": updated - run_started,  # wall clock since this process began
                    "perf/completion_tokens": completion_tokens,
                    "perf/tokens_per_s": completion_tokens / max(updated - step_started, 1e-9),
                })

            if not finite and cfg.on_nonfinite == "stop":
                what = "loss" if not math.isfinite(step_loss) else "grad norm"
                return diverged(f"non-finite {what} at step {step}", metrics)

            if step % int(cfg.eval.every) == 0 or step == int(cfg.steps):
                metrics.update(evaluate_now())
                metrics["time/eval_s"] = time.perf_counter() - updated
            log.log(metrics)
            if step % int(cfg.samples_every) == 0:
                log.samples(step, [{"prompt": problems[int(group_index[i])].prompt, "completion": texts[i],
                                    "reward": rewards[i].item(), "truncated": bool(roll.truncated[i])}
                                   for i in range(min(int(cfg.samples_per_log), len(texts)))])
            if (step % int(cfg.checkpoint_every) == 0 or step == int(cfg.steps)) and dp.is_main:
                save_checkpoint(run_dir, policy, tokenizer, {
                    "step": step, "skipped_steps": skipped_steps, "optimizer": optimizer.state_dict(),
                    "schedule": schedule.state_dict(), "sampler": sampler.get_state(),
                    **{name: controller.state_dict() for name, controller in controllers.items()},
                    "snapshots": list(snapshots)})
            log.status("running", step)
            progress.update(step, metrics, say)

        result.state, result.step = "completed", int(cfg.steps)
        result.final_accuracy = metrics.get("eval/accuracy") if int(cfg.steps) > start_step else None
        log.status("completed", result.step)
        return result
    except BaseException as err:  # a crash or Ctrl-C: record it, then let it propagate
        reason = f"{type(err).__name__}: {err}".strip()
        log.status("failed", step, reason[:500])
        raise
    finally:
        if progress is not None:
            progress.stop()
        log.close()
        del train_model   # (torchrun) DDP lets go of the process group before the group is destroyed
        dp.stop()


def open_run_dir(cfg: DictConfig, run_dir: Path) -> tuple[dict | None, Path | None]:
    """The run dir's status and the checkpoint to continue from (with resume=true). A dir that
    holds a run is only continued, and only with the config it was started with."""
    status = read_status(run_dir)
    checkpoint = find_checkpoint(run_dir) if cfg.resume else None
    if status is not None and not cfg.resume:
        raise ConfigError(f"run dir {run_dir} already holds a run ({status['state']}); "
                          f"continue it with `grpo-ablate train --resume {run_dir}` or pick a new dir")
    if status is not None and status.get("config_hash") != config_hash(cfg):
        raise ConfigError(f"cannot resume {run_dir}: the config differs from the one it was started "
                          "with (only steps, logger, run labels and threads may change)")
    return status, checkpoint


def already_finished(status: dict | None, cfg: DictConfig) -> bool:
    """A finished result is never redone: completed at (or past) the asked-for steps, or diverged."""
    return status is not None and (status["state"] == "diverged"
                                   or status["state"] == "completed" and status["step"] >= cfg.steps)


def evaluate(policy, rollouts: Rollouts, problems, max_new_tokens: int) -> dict:
    """Greedy decoding on the held-out split (GRPO runs and control runs share it)."""
    policy.eval()
    graded = rollouts(problems, 1, 0.0, ("eval",), max_new_tokens=max_new_tokens)
    return {"eval/accuracy": sum(graded.scores.tolist()) / len(graded.scores),
            "eval/length_mean": graded.roll.lengths.float().mean().item(),
            "eval/truncated_frac": graded.roll.truncated.float().mean().item()}


@dataclass
class SampledGroups:
    roll: Rollout
    problems: list           # one per group
    texts: list[str]         # one per row
    scores: torch.Tensor     # [rows] the verifier's rewards
    group_index: torch.Tensor  # [rows] row -> group (groups may be ragged)
    rounds: int


def sample_groups(rollouts: Rollouts, task, cfg: DictConfig, step: int, T: float) -> SampledGroups:
    """The batch of groups for one optimizer step, per the `sampling` family.

    Round r draws B fresh prompts x G completions; the family's filter keeps groups (static:
    all; dynamic: those with reward variance) until B are kept or max_rounds is reached, and
    then trains on what was kept (all of the last round if nothing was). Groups whose rewards
    are all equal then grow by g_step completions up to g_max (dynamic_group; otherwise
    g_max = G and nothing grows). Raises NonFiniteLogits if the policy has diverged.
    """
    B, G = int(cfg.rollout.prompts_per_step), int(cfg.rollout.group_size)
    group_filter, max_rounds = trick(cfg, "sampling"), int(cfg.sampling.max_rounds)
    g_step, g_max = int(cfg.sampling.get("g_step") or 1), int(cfg.sampling.get("g_max") or G)

    def sample(problems, n, key):
        graded = rollouts(problems, n, T, key)
        return graded.roll, graded.texts, graded.scores

    rolls, problems, texts, scores, rounds = [], [], [], [], 0
    for sampling_round in range(max_rounds):
        round_problems = task.train_batch(B, int(cfg.seed), step, sampling_round)
        roll, round_texts, round_scores = sample(round_problems, G, ("train", step, sampling_round))
        rounds += 1
        kept = group_filter(round_scores.view(B, G)).nonzero().squeeze(1)
        kept = kept[:B - len(problems)]                  # never more than B groups in total
        rows = (kept[:, None] * G + torch.arange(G)).reshape(-1)
        rolls.append(select_rows(roll, rows.to(roll.sequences.device)))
        problems += [round_problems[g] for g in kept.tolist()]
        texts += [round_texts[r] for r in rows.tolist()]
        scores.append(round_scores[rows])
        if len(problems) == B:
            break
    if not problems:
        rolls, problems, texts, scores = [roll], round_problems, round_texts, [round_scores]
    group_index = torch.arange(len(problems)).repeat_interleave(G)

    growth = 0
    while True:
        _, spread = group_mean_std(torch.cat(scores), group_index)
        sizes = torch.bincount(group_index, minlength=len(problems))
        varied = torch.zeros(len(problems), dtype=torch.bool).index_fill_(0, group_index[spread > 0], True)
        grow = ((~varied) & (sizes < g_max)).nonzero().squeeze(1).tolist()
        if not grow:
            break
        growth += 1
        roll, more_texts, more_scores = sample([problems[g] for g in grow], g_step, ("grow", step, growth))
        rolls.append(roll)
        texts += more_texts
        scores.append(more_scores)
        group_index = torch.cat([group_index, torch.tensor(grow).repeat_interleave(g_step)])
    return SampledGroups(concat_rollouts(rolls, rollouts.pad_id), problems, texts,
                         torch.cat(scores), group_index, rounds)


def _weights(model) -> dict:
    """A detached copy of the weights (a snapshot for the two-layer KL anchor)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class _Silent:
    """The run log of a rank other than 0 under torchrun: rank 0 alone writes the run dir."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _progress:
    """A rich progress bar (step, reward, accuracy) on a terminal; a line per eval otherwise."""

    def __init__(self, console, total: int, done: int):
        self.bar = None
        if console is not None and console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console)
            self.task = self.bar.add_task("train", total=total, completed=done, info="")
            self.bar.start()

    def update(self, step: int, metrics: dict, say) -> None:
        info = (f"reward {metrics['reward/mean']:.3f}  len {metrics['length/mean']:.1f}" if "reward/mean" in metrics
                else f"sft loss {metrics['loss']:.3f}")   # a supervised control run samples nothing
        if "eval/accuracy" in metrics:
            info += f"  eval acc {metrics['eval/accuracy']:.3f}"
            if self.bar is None:
                say(f"step {step}  {info}  ({metrics['time/step_s']:.2f} s/step)")
            else:
                self.bar.console.print(f"step {step}  {info}")
        if self.bar is not None:
            self.bar.update(self.task, completed=step, info=info)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
