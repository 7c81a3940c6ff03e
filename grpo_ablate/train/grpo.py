"""`grpo-ablate train`: one GRPO run, set up here, then stepped by the run skeleton.

    train()          validate, turn the config into the run spec (config/spec.py), join the processes
                     (torchrun), open the run dir, build, run
    build_grpo()     the task, the policy and its anchors, the tricks' state (plugins), the
                     optimizer and the sampler: a `GRPOTrainer` (train/step.py) ready to step,
                     each part built from its own part of the spec
Read `GRPOTrainer.step` for what one step does. Every trick enters through the registry by the
name its config group chose (bound once, in the spec); nothing here branches on a trick's name.
The DictConfig stops at train()'s first screen: the checks, the inert and pair warnings and the resume
rules read it there (they are the config layer); below it only the spec travels.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch
from omegaconf import DictConfig
from rich.console import Console

from grpo_ablate.config.here import check_here
from grpo_ablate.config.validate import validate
from grpo_ablate.config.inert import chosen_tricks, inert_tricks
from grpo_ablate.config.pair_rules import run_lines
from grpo_ablate.models import (AdapterDisabled, add_lora, autocast_forward, disable_dropout,
                                enable_activation_checkpointing, load_model_and_tokenizer, model_dir,
                                model_device, started_from, stop_token_ids, weights_digest)
from grpo_ablate.sampling.decode import sampler_seed
from grpo_ablate.sampling.engines import HFEngine, Rollouts, build_engine, rng_mode
from grpo_ablate.sampling.lean import unsupported as lean_unsupported
from grpo_ablate.sampling.prompts import PromptEncoder
from grpo_ablate.tasks import build_task
from grpo_ablate.rundir.lock import DirLock
from grpo_ablate.train.distributed import DataParallel
from grpo_ablate.config.resume_rules import (already_finished, check_same_start, open_run_dir, split_changed,
                                             threads_to_run)
from grpo_ablate.config.spec import BoundOption, ModelSettings, RunSpec, run_spec
from grpo_ablate.train.run import (Optimization, RunResult, attention_implementation, finished_result, prepare_process,
                                   run_steps)
from grpo_ablate.train.state import active_plugins, extra_param_groups
from grpo_ablate.train.step import GRPOTrainer, Policies


def train(cfg: DictConfig, run_dir: str | Path, overrides: list[str] = (), console=None) -> RunResult:
    validate(cfg)
    check_here(cfg)     # packages, GPU, offline hub, torchrun's processes: where the run runs
    spec = run_spec(cfg)   # frozen and typed: below this screen each part gets its own piece, never cfg
    # torchrun: one process per device, each training on its part of the batch (distributed.py);
    # rank 0 alone writes the run dir (Hydra made it there) and talks to the console.
    dp = DataParallel(fsdp=spec.model.fsdp)   # model.fsdp=true: the model sharded (fsdp.py)
    device = model_device(cfg.model, dp.local_rank)   # model.device: the GPU if any (the tiny model: CPU)
    dp.start(device)
    try:
        run_dir = Path(dp.broadcast(str(run_dir)))
        console = console if dp.is_main else None
        say = console.print if console is not None else (lambda *a, **k: None)
        warn = Console(stderr=True, soft_wrap=True).print if console is not None else say   # on stderr, one line
        for name, reason in inert_tricks(cfg, chosen_tricks(cfg, overrides)):   # compute it would waste
            warn(f"[yellow]warning[/]: {name} {reason}", markup=True, highlight=False)
        for line in run_lines(cfg):   # settings that change what another trick means (config/pair_rules.py)
            warn(f"[yellow]warning[/]: {line}", markup=True, highlight=False)
        if dp.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
        lock = DirLock(run_dir, "run dir", say).acquire() if dp.is_main else None   # one writer a run dir
        try:
            status, checkpoint = open_run_dir(cfg, run_dir)
            if already_finished(status, cfg):
                return finished_result(status, run_dir, say)
            if checkpoint is not None and (changed := split_changed(cfg, run_dir)):
                warn(f"[yellow]warning[/]: {changed}", markup=True, highlight=False)
            threads = prepare_process(threads_to_run(spec.threads, status, checkpoint), spec.seed)
            grpo, first_row = build_grpo(spec, device, dp, checkpoint, say)
            check_same_start(status if checkpoint else None, grpo.p.start, run_dir)
            try:
                return run_steps(spec.schedule, spec.record, run_dir, overrides, grpo, checkpoint, console,
                                 writes=dp.is_main, first_row=first_row, started_from=grpo.p.start, threads=threads)
            finally:
                del grpo.train_model   # (torchrun) DDP lets go of the process group before it is destroyed
        finally:
            if lock is not None:
                lock.release()
    finally:
        dp.stop()


def build_grpo(spec: RunSpec, device: torch.device, dp: DataParallel, checkpoint: Path | None, say):
    """(the GRPOTrainer of this run, metrics for step 0's row). With a checkpoint, the weights
    come from it; the rest of its state is loaded by the run skeleton."""
    task = build_task(spec.task)
    model_path = dp.main_first(lambda: model_dir(spec.model.group, task, log=say))   # GGUF: converted once, cached
    # a warm start trained just now (not found in the cache) drew from the global RNG; a cached one did not. The
    # RNG is seeded again, so what draws from it next (LoRA adapters, a critic's value head) starts alike either way
    torch.manual_seed(spec.seed)
    tricks = spec.tricks
    policies = load_policies(spec.model, tricks["lm_head"], spec.ref_kl, model_path, tricks["kl"], device, checkpoint,
                             shard=dp.shard)
    if (sharding := dp.sharding(policies.policy)) is not None:   # model.fsdp=true: how it is split
        say(sharding)
    vocabulary = getattr(getattr(policies.policy, "config", None), "vocab_size", None)
    # the config cannot know the vocabulary; the model does
    if vocabulary is not None and spec.rollout.filters.top_k >= vocabulary:
        say(f"[yellow]warning[/]: rollout.top_k={spec.rollout.filters.top_k} is at least the vocabulary ({vocabulary} "
            "tokens): it keeps every token, so the filter is off; give top_k below it, or 0")
    encode = PromptEncoder(policies.tokenizer, task)      # problem -> prompt ids (chat template if any)
    prompt_counts = encode.drop_long_prompts(task, say)   # task.max_prompt_tokens: drop longer ones
    # A critic (adv=gae): a value head on the policy's last hidden state, trained alongside it.
    if tricks["adv"].option.uses_values:
        policies.value_head = torch.nn.Linear(policies.policy.config.hidden_size, 1).to(device)
    plugins = active_plugins(spec, task, policies)   # the tricks' state across steps (train/state/)
    critic = list(policies.value_head.parameters()) if policies.value_head is not None else []
    trained = [p for p in policies.policy.parameters() if p.requires_grad] + critic   # LoRA: the adapters only
    # the sampler's draws (optim.rng is their stream) from the seed, or from a placebo's salt of it (sweep aa)
    stream_seed = sampler_seed(spec.seed, spec.rollout.stream_salt)
    optim = Optimization([{"params": trained}, *extra_param_groups(plugins)], spec.optim, stream_seed,
                         spec.schedule.steps)
    dp.checkpoint_full_optimizer_state(optim.optimizer)   # FSDP: checkpoints hold the full AdamW state
    # Sampling (rollout.backend: the policy itself, or vLLM), decoding, scoring: the whole batch.
    engine = build_engine(spec.rollout, spec.model.dtype, stream_seed, policies.policy, dp, model_path)
    if isinstance(engine, HFEngine) and engine.lean and device.type == "cpu":   # said once, here
        if (reason := lean_unsupported(getattr(policies.policy, "module", policies.policy))) is not None:
            say(f"rollout: LeanDecoder does not support {reason}; sampling with the model's own forward")
    rollouts = Rollouts(engine, policies.tokenizer, encode, task, dp, device,
                        eos_id=stop_token_ids(policies.policy, policies.tokenizer),
                        max_new_tokens=spec.rollout.max_new_tokens, seed=stream_seed,
                        rng=rng_mode(spec.rollout.rng, dp), stream=optim.rng, filters=spec.rollout.filters,
                        head=spec.sampler_head())
    return GRPOTrainer(spec, task, encode, policies, plugins, optim, rollouts, dp, device), prompt_counts


def load_policies(model: ModelSettings, lm_head: BoundOption, ref_kl: bool, model_path, kl: BoundOption,
                  device: torch.device, checkpoint: Path | None, shard=lambda model: model) -> Policies:
    """The policy (from the checkpoint when resuming), and the frozen models a KL anchors it to
    (pi_ref also for `ref_kl`, metrics.ref_kl). `shard` (model.fsdp=true: DataParallel.shard)
    shards the policy and a separate reference. Their `start`: what the run started from (its weights'
    digest, LoRA's base included: models.started_from) wherever they are loaded (None: a resume that
    loads the checkpoint alone)."""
    attn = attention_implementation(model.attn_implementation, device)
    dtype = model.dtype                            # compute dtype; weights stay float32
    lora = model.lora                              # model.lora.r > 0: train LoRA adapters only
    kl_start = kl.fn()                             # the kl option at its start: which anchors its terms need

    head_precision = lm_head.fn                    # lm_head=fp32: the head and logits in float32

    def load(path):   # on the device; with model.dtype != float32 the forward runs under autocast
        model, tok = load_model_and_tokenizer(path, attn_implementation=attn)
        return head_precision(autocast_forward(model.to(device), dtype)), tok

    # With LoRA the base comes from model.path and the adapters from the checkpoint (on resume).
    policy, tokenizer = load(model_path if lora else checkpoint or model_path)
    start = weights_digest(policy) if lora or checkpoint is None else None   # the start's weights, where loaded
    if model.disable_dropout:                      # the ratio and KL measure the update, not dropout
        disable_dropout(policy)
    if model.gradient_checkpointing:              # recompute activations in backward: less memory
        enable_activation_checkpointing(policy)
    if lora:
        policy = add_lora(policy, model.group, checkpoint)
    # The reference policy is the starting model, frozen. It is loaded and run only when a KL
    # term or a KL metric uses it: with beta = 0 there is no second model and no extra forward.
    reference = None
    if (kl_start.beta > 0 or ref_kl) and lora:   # the base is the policy, adapters off
        reference = AdapterDisabled(policy)
    elif kl_start.beta > 0 or ref_kl:
        reference = load(model_path)[0] if checkpoint else copy.deepcopy(policy)
        start = start or weights_digest(reference)   # a resume loads the start again here
        reference = shard(reference)
        reference.eval().requires_grad_(False)
    # A second anchor, the policy as it was prev_lag steps ago (two-layer KL): a frozen copy,
    # loaded each step from the run's history of weights (train/policy_history.py)
    previous = copy.deepcopy(policy).eval().requires_grad_(False) if kl_start.beta_prev > 0 else None
    lag = kl_start.prev_lag if previous is not None else 0
    start = started_from(model.group, model_path, start) if start else None
    return Policies(shard(policy), tokenizer, reference, previous, lag, value_head=None, start=start)
