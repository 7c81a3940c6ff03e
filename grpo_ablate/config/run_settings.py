"""The run's own settings (everything in conf/ that is not a trick family) and what each may be.

One declaration a key: validate.py checks every key here that the composed config has (a key
only some options of a group have, `rollout.lean_decoder`, `logger.mode`, is checked where it
is), before anything is written; checks across keys (reward.correct > reward.wrong, control.budget
=wall needs wall_s) stay in validate.py. A trick family's knobs are declared with its options
(grpo_ablate/tricks/). tests/test_run_settings.py fails on a key of the composed config that
is neither declared here nor under one of the EXEMPT prefixes, and sends an out-of-range value
of every declaration through the CLI.
"""
from __future__ import annotations

from grpo_ablate.allowed import FLAG, FRACTION, NON_NEGATIVE, POSITIVE, POSITIVE_INT, Allowed, choice

NON_NEGATIVE_INT = Allowed("integer", low=0)
OPTIONAL_POSITIVE_INT = Allowed("integer", low=0, low_open=True, optional=True)
MODEL_DTYPE = choice("float32", "bfloat16", "float16")
TEXT, OPTIONAL_TEXT = Allowed("text"), Allowed("text", optional=True)

RUN_SETTINGS = {
    "seed": NON_NEGATIVE_INT, "steps": POSITIVE_INT,
    "threads": OPTIONAL_POSITIVE_INT,                  # null: torch's default
    "resume": choice(False, True, "restart"),          # set by `train --resume` / `--restart`
    "on_nonfinite": choice("stop", "skip"),
    "reward.correct": Allowed(note="finite: an infinite reward makes every run diverge"),
    "reward.wrong": Allowed(note="finite: an infinite reward makes every run diverge"),
    "optim.lr": POSITIVE, "optim.weight_decay": NON_NEGATIVE,
    "optim.betas": Allowed("numbers", low=0, high=1, high_open=True, length=2, note="Adam's beta1, beta2"),
    "optim.max_grad_norm": POSITIVE, "optim.warmup_steps": NON_NEGATIVE_INT,
    "optim.schedule": choice("constant", "linear", "cosine"),
    "checkpoint_every": POSITIVE_INT, "samples_every": POSITIVE_INT,
    "samples_per_log": NON_NEGATIVE_INT,               # 0: samples.jsonl gets no completions
    "metrics.ref_kl": FLAG,
    "diag.grad_conflict": FLAG, "diag.every": POSITIVE_INT,
    "diag.rows": OPTIONAL_POSITIVE_INT,                # null: the whole batch
    "diag.last_layers": OPTIONAL_POSITIVE_INT,         # null: every parameter
    "debug.fail_at_step": OPTIONAL_POSITIVE_INT,       # steps count from 1
    "debug.nan_loss_at_step": OPTIONAL_POSITIVE_INT,
    # rollout=hf|vllm (group_size >= 2 under a group statistic, and the HF sampler's dtypes: validate.py)
    "rollout.backend": choice("hf", "vllm"), "rollout.prompts_per_step": POSITIVE_INT,
    "rollout.group_size": POSITIVE_INT, "rollout.max_new_tokens": POSITIVE_INT,
    "rollout.dtype": Allowed("choice", choices=MODEL_DTYPE.choices, optional=True),   # null: model.dtype (vllm)
    "rollout.lean_decoder": FLAG,
    "rollout.rng": Allowed("choice", choices=("auto", "stream", "per_row"), optional=True),   # null: auto
    "rollout.stream_salt": NON_NEGATIVE_INT,           # 0: the sampler's stream is the seed's own (sweep aa)
    # sampling filters (sampling/filters.py) and the trainer's replay of the kept sets they leave
    "rollout.top_k": NON_NEGATIVE_INT,                 # 0: off
    "rollout.top_p": Allowed(low=0, low_open=True, high=1),   # 1: off
    "rollout.min_p": Allowed(low=0, high=1, high_open=True),  # 0: off
    "rollout.sampling_replay": FLAG,
    "rollout.gpu_memory_utilization": Allowed(low=0, low_open=True, high=1),
    "rollout.cpu_kv_cache_gib": POSITIVE,
    "rollout.max_model_len": OPTIONAL_POSITIVE_INT,
    "rollout.enforce_eager": Allowed("bool", optional=True),   # null: true on a CPU
    "eval.every": POSITIVE_INT,
    "eval.max_new_tokens": POSITIVE_INT,               # after rollout's, which it defaults to
    "eval.keep_weights": FLAG,
    # eval=greedy|sampled: the eval protocol (evals/protocol.py; the rules across its keys: validate.py)
    "eval.name": TEXT, "eval.samples": POSITIVE_INT, "eval.temperature": NON_NEGATIVE,
    "eval.top_k": NON_NEGATIVE_INT,                    # 0: off
    "eval.top_p": Allowed(low=0, low_open=True, high=1),   # 1: off
    "eval.min_p": Allowed(low=0, high=1, high_open=True),  # 0: off
    "eval.pass_k": Allowed("numbers", low=1, optional=True, note="each k an integer <= eval.samples; null: 2, 4, "
                           "8, ... up to eval.samples"),
    "eval.maj_k": Allowed("numbers", low=1, optional=True, note="each k an integer <= eval.samples; null: "
                          "eval.samples where the task parses answers"),
    # model=tiny|tiny_aligned|hf|smollm2 (the path, device pattern, fsdp and LoRA rules: validate.py)
    "model.name": choice("tiny", "hf"),
    "model.stage": Allowed("choice", choices=("base", "aligned"), optional=True),
    "model.path": OPTIONAL_TEXT, "model.gguf_file": OPTIONAL_TEXT, "model.cache_dir": TEXT,
    "model.device": TEXT, "model.dtype": MODEL_DTYPE, "model.attn_implementation": OPTIONAL_TEXT,
    "model.gradient_checkpointing": FLAG, "model.fsdp": FLAG,
    "model.disable_dropout": FLAG, "model.remove_padding": FLAG,
    "model.lora.r": NON_NEGATIVE_INT, "model.lora.alpha": POSITIVE,
    "model.lora.dropout": Allowed(low=0, high=1, high_open=True),
    "model.lora.target_modules": Allowed("any", note="peft's: all-linear or a list of module names"),
    **{f"model.arch.{k}": POSITIVE_INT for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                  "num_attention_heads", "num_key_value_heads",
                                                  "max_position_embeddings")},
    "model.warmup.steps": POSITIVE_INT, "model.warmup.batch_size": POSITIVE_INT,
    "model.warmup.lr": POSITIVE, "model.warmup.seed": NON_NEGATIVE_INT, "model.warmup.slip_prob": FRACTION,
    # logger=none|wandb, control=none|base|sft|rft
    "logger.name": choice("none", "wandb"), "logger.project": TEXT, "logger.entity": OPTIONAL_TEXT,
    "logger.mode": choice("auto", "online", "offline", "disabled"),
    "control.name": choice("none", "base", "sft", "rft"), "control.sample": FLAG,
    "control.budget": choice("tokens", "wall"),
    "control.wall_s": Allowed(low=0, low_open=True, optional=True),   # needed by budget=wall (validate.py)
}

# Keys that are no run setting of this table, and why.
EXEMPT = {
    "task.": "a task's settings are its constructor's arguments, checked by constructing it (validate.py)",
    "run.": "W&B labels (name, group, tags) that the sweep launcher fills",
    "sweep.": "labels `grpo-ablate sweep` sets on each of its runs",
    "tricks.": "which named tricks are on: filled by +trick=<name> and checked by check_tricks",
    "hydra.": "Hydra's own (the run dir: grpo_ablate/rundir/files.py)",
}
