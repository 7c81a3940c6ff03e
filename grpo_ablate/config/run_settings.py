"""The run's own settings (everything in conf/ that is not a trick family), each declared once here.

`BASE_SETTINGS`: conf/config.yaml's own settings, each a `Setting` (its default, which `make catalogue`
writes into conf/config.yaml with its note; what it may be; the run spec's field: config/spec.py makes
the optim, diag and reward groups from them). `RUN_SETTINGS`: what every run setting may be, the base
ones' from their declarations and those whose defaults each option of a config group sets (rollout=,
eval=, model=, logger=, control=) declared below. Each `Allowed` also says what a run's identity does
with the setting (config/identity.py): a `resumable` one may differ on resume (the budget, threads, the
logger, diagnostics that only observe: tests/test_diagnostics.py), and one added after runs existed is
hashed only away from its `neutral` value, the one every run had before it (the sampler's filters off,
the greedy eval), so those runs hash, and resume, as they did.

validate.py checks every key here that the composed config has (a key only some options of a group
have, `rollout.lean_decoder`, `logger.mode`, is checked where it is), before anything is written;
checks across keys (reward.correct > reward.wrong, control.budget=wall needs wall_s) stay in
validate.py. A trick family's knobs are declared with its options (grpo_ablate/tricks/).
tests/test_run_settings.py fails on a key of the composed config that is neither declared here nor
under one of the EXEMPT prefixes, and sends an out-of-range value of every declaration through the CLI.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from grpo_ablate.allowed import FLAG, FRACTION, NON_NEGATIVE, POSITIVE, POSITIVE_INT, Allowed, choice
from grpo_ablate.evals.protocol import GREEDY
from grpo_ablate.tricks.conditions import FILTERS_OFF

NON_NEGATIVE_INT = Allowed("integer", low=0)
OPTIONAL_POSITIVE_INT = Allowed("integer", low=0, low_open=True, optional=True)
MODEL_DTYPE = choice("float32", "bfloat16", "float16")
TEXT, OPTIONAL_TEXT = Allowed("text"), Allowed("text", optional=True)
GREEDY_SETTINGS = {"name": GREEDY.name, **GREEDY.settings()}

@dataclass(frozen=True)
class Setting:
    """A setting of conf/config.yaml's own (no config group's): its default, which `make catalogue` writes
    into conf/config.yaml with `doc` beside it (config/catalogue.py), and what it may be."""
    default: Any
    allowed: Allowed
    doc: str = ""


# conf/config.yaml's groups of settings, each with the line written above it
GROUP_DOCS = {
    "reward": "the verifier's score in [0, 1] mapped to [wrong, correct]",
    "eval": "the protocol (samples, temperature, ...) is the eval group's (conf/eval/)",
    "diag": "diagnostics that only observe: gradient conflicts, input dependence (README: Diagnostics)",
    "debug": "fault injection, for testing that a sweep survives its runs",
}
FINITE = Allowed(note="finite: an infinite reward makes every run diverge")
BASE_SETTINGS = {
    "seed": Setting(0, NON_NEGATIVE_INT),
    "steps": Setting(30, POSITIVE_INT.but(resumable=True), "optimizer steps (one rollout each); 30 x 8 prompts: the "
                     "embedded default's budget, calibrated so its leave-one-out decides (docs/calibration.md)"),
    "threads": Setting(None, OPTIONAL_POSITIVE_INT.but(resumable=True),
                       "torch CPU threads; null = the cores nobody else is using (docs/performance.md#threads)"),
    "resume": Setting(False, choice(False, True, "restart").but(resumable=True),
                      "set by `grpo-ablate train --resume RUN_DIR` (`--restart`: restart)"),
    "on_nonfinite": Setting("stop", choice("stop", "skip"),
                            "stop: NaN/Inf marks the run diverged (a result) | skip: drop the step"),
    "reward.correct": Setting(1.0, FINITE),
    "reward.wrong": Setting(0.0, FINITE, "0: rewards {0,1} (default) | -1: {-1,1} (the Tricks or Traps study)"),
    "optim.lr": Setting(2.0e-4, POSITIVE, "the embedded default's peak lr (docs/calibration.md); references use "
                        "~1e-6 on LLMs"),
    "optim.weight_decay": Setting(0.0, NON_NEGATIVE),
    "optim.betas": Setting([0.9, 0.99], Allowed("numbers", low=0, high=1, high_open=True, length=2,
                                                note="Adam's beta1, beta2"), "two numbers in [0, 1)"),
    "optim.max_grad_norm": Setting(1.0, POSITIVE, "all references clip the global grad norm at 1.0"),
    "optim.warmup_steps": Setting(0, NON_NEGATIVE_INT, "linear lr warm-up, then `schedule`"),
    "optim.schedule": Setting("linear", choice("constant", "linear", "cosine"),
                              "after the warm-up: constant | linear | cosine (decay to 0 at the last step); "
                              "linear (TRL's default): the default's curves rise and hold (docs/calibration.md)"),
    "eval.every": Setting(5, POSITIVE_INT, "eval on the held-out split every N steps (and at 0 and the end): 7 "
                          "points on the default's curve for its summaries and fits (~4% of a run)"),
    "eval.max_new_tokens": Setting("${rollout.max_new_tokens}", POSITIVE_INT, "the rollout's, unless set"),
    "eval.keep_weights": Setting(False, FLAG.but(resumable=True),   # keeps what the run computes anyway
                                 "true: keep the policy's weights at every eval step (weights/step-<N>/), so "
                                 "`grpo-ablate eval RUN --steps all` can score the whole curve under another "
                                 "protocol"),
    "checkpoint_every": Setting(10, POSITIVE_INT),
    "samples_every": Setting(10, POSITIVE_INT, "write a few completions to samples.jsonl every N steps"),
    "samples_per_log": Setting(4, NON_NEGATIVE_INT, "completions written each time (0: none)"),
    "metrics.ref_kl": Setting(False, FLAG, "run the reference model for KL metrics even when beta = 0"),
    "diag.grad_conflict": Setting(False, FLAG.but(resumable=True), "true: log grad_norm/<term> and "
                                  "grad_cos/<a>__<b> every `every` steps"),
    "diag.every": Setting(5, POSITIVE_INT.but(resumable=True), "off costs nothing; on, a diagnosed step costs "
                          "about one more update"),
    "diag.rows": Setting(32, OPTIONAL_POSITIVE_INT.but(resumable=True), "on a sub-batch of this many completions "
                         "(whole groups, those with a nonzero advantage first); null = the whole batch"),
    "diag.last_layers": Setting(1, OPTIONAL_POSITIVE_INT.but(resumable=True), "gradients w.r.t. the parameters "
                                "of the last N transformer blocks only (the backward stops there); null = every "
                                "parameter of the policy"),
    # the template-collapse diagnostic (RAGEN-2; train/input_dependence.py): observation only, so resumable
    # (never hashed), and off (0) where every run before it was
    "diag.input_dependence_every": Setting(0, NON_NEGATIVE_INT.but(resumable=True, neutral=0),
                                           "template collapse: log diag/input_dependence (the batch's completions "
                                           "scored under their own prompt and another group's) at step 1 and every "
                                           "N steps; 0 = off"),
    "diag.input_dependence_rows": Setting(8, Allowed("integer", low=2, optional=True, resumable=True, neutral=8),
                                          "on this many completions (the groups' in turns: one forward of them); "
                                          "null = the whole batch"),
    "debug.fail_at_step": Setting(None, OPTIONAL_POSITIVE_INT, "raise an error at this step (the run ends "
                                  "\"failed\"; steps count from 1)"),
    "debug.nan_loss_at_step": Setting(None, OPTIONAL_POSITIVE_INT, "make the loss NaN at this step (the run ends "
                                      "\"diverged\")"),
}

# The settings whose defaults each option of their config group sets (conf/<group>/<option>.yaml).
RUN_SETTINGS = {
    **{key: setting.allowed.but(unset=setting.default) for key, setting in BASE_SETTINGS.items()},
    # rollout=hf|vllm (group_size >= 2 under a group statistic, and the HF sampler's dtypes: validate.py)
    "rollout.backend": choice("hf", "vllm"), "rollout.prompts_per_step": POSITIVE_INT,
    "rollout.group_size": POSITIVE_INT, "rollout.max_new_tokens": POSITIVE_INT,
    "rollout.dtype": Allowed("choice", choices=MODEL_DTYPE.choices, optional=True,   # null: model.dtype (vllm)
                             unset="float32"),
    "rollout.lean_decoder": FLAG.but(unset=False),
    "rollout.rng": Allowed("choice", choices=("auto", "stream", "per_row"), optional=True, unset="auto"),   # null: auto
    "rollout.stream_salt": NON_NEGATIVE_INT.but(neutral=0, unset=0),   # 0: the sampler's stream is the seed's own (aa)
    # sampling filters (sampling/filters.py), off at FILTERS_OFF, and the trainer's replay of the kept sets they leave
    "rollout.top_k": NON_NEGATIVE_INT.but(neutral=FILTERS_OFF["top_k"], unset=FILTERS_OFF["top_k"]),
    "rollout.top_p": Allowed(low=0, low_open=True, high=1, neutral=FILTERS_OFF["top_p"], unset=FILTERS_OFF["top_p"]),
    "rollout.min_p": Allowed(low=0, high=1, high_open=True, neutral=FILTERS_OFF["min_p"], unset=FILTERS_OFF["min_p"]),
    "rollout.sampling_replay": FLAG.but(neutral=True, unset=True),
    "rollout.gpu_memory_utilization": Allowed(low=0, low_open=True, high=1),
    "rollout.cpu_kv_cache_gib": POSITIVE,
    "rollout.max_model_len": OPTIONAL_POSITIVE_INT,
    "rollout.enforce_eager": Allowed("bool", optional=True),   # null: true on a CPU
    # eval=greedy|sampled: the eval protocol (evals/protocol.py; the rules across its keys: validate.py),
    # neutral at the greedy protocol every run had before there was a choice
    **{f"eval.{key}": allowed.but(neutral=GREEDY_SETTINGS[key]) for key, allowed in {
        "name": TEXT, "samples": POSITIVE_INT, "temperature": NON_NEGATIVE,
        "top_k": NON_NEGATIVE_INT,                     # 0: off
        "top_p": Allowed(low=0, low_open=True, high=1),    # 1: off
        "min_p": Allowed(low=0, high=1, high_open=True),   # 0: off
        "pass_k": Allowed("numbers", low=1, optional=True, note="each k an integer <= eval.samples; null: 2, 4, "
                          "8, ... up to eval.samples"),
        "maj_k": Allowed("numbers", low=1, optional=True, note="each k an integer <= eval.samples; null: "
                         "eval.samples where the task parses answers")}.items()},
    # model=tiny|tiny_aligned|hf|smollm2 (the path, device pattern, fsdp and LoRA rules: validate.py)
    "model.name": choice("tiny", "hf"),
    "model.stage": Allowed("choice", choices=("base", "aligned"), optional=True),
    "model.path": OPTIONAL_TEXT, "model.gguf_file": OPTIONAL_TEXT, "model.cache_dir": TEXT,
    "model.device": TEXT, "model.dtype": MODEL_DTYPE.but(unset="float32"), "model.attn_implementation": OPTIONAL_TEXT,
    "model.gradient_checkpointing": FLAG.but(unset=False), "model.fsdp": FLAG.but(unset=False),
    "model.disable_dropout": FLAG.but(unset=True), "model.remove_padding": FLAG.but(unset=True),
    "model.lora.r": NON_NEGATIVE_INT.but(unset=0), "model.lora.alpha": POSITIVE,
    "model.lora.dropout": Allowed(low=0, high=1, high_open=True),
    "model.lora.target_modules": Allowed("any", note="peft's: all-linear or a list of module names"),
    **{f"model.arch.{k}": POSITIVE_INT for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                  "num_attention_heads", "num_key_value_heads",
                                                  "max_position_embeddings")},
    "model.warmup.steps": POSITIVE_INT, "model.warmup.batch_size": POSITIVE_INT,
    "model.warmup.lr": POSITIVE, "model.warmup.seed": NON_NEGATIVE_INT, "model.warmup.slip_prob": FRACTION,
    # logger=none|wandb, control=none|base|sft|rft
    **{key: allowed.but(resumable=True) for key, allowed in {   # where a run's numbers are also sent
        "logger.name": choice("none", "wandb"), "logger.project": TEXT, "logger.entity": OPTIONAL_TEXT,
        "logger.mode": choice("auto", "online", "offline", "disabled")}.items()},
    "control.name": choice("none", "base", "sft", "rft"), "control.sample": FLAG.but(unset=True),
    "control.budget": choice("tokens", "wall"),
    "control.wall_s": Allowed(low=0, low_open=True, optional=True),   # needed by budget=wall (validate.py)
}



def setting(cfg, key: str):
    """A run setting's value in a composed config, or, where the config has no such key (an option of
    its group that does not set it), what its declaration says that means (`Allowed.unset`)."""
    return OmegaConf.select(cfg, key, default=RUN_SETTINGS[key].unset)


@dataclass(frozen=True)
class Exempt:
    why: str
    labels: bool = False   # labels only, which a run's hash leaves out


# Keys that are no run setting of this table, and why.
EXEMPT = {
    "task.": Exempt("a task's settings are its constructor's arguments, checked by constructing it (validate.py)"),
    "run.": Exempt("W&B labels (name, group, tags) that the sweep launcher fills", labels=True),
    "sweep.": Exempt("labels `grpo-ablate sweep` sets on each of its runs", labels=True),
    "tricks.": Exempt("which named tricks are on: filled by +trick=<name> and checked by check_tricks"),
    "hydra.": Exempt("Hydra's own (the run dir: grpo_ablate/rundir/files.py)"),
}
