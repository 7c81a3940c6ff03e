"""The torch half of `grpo-ablate eval` (rescore/command.py plans, this scores): a run's policy at a
step, loaded as the run held it (its start from the model source; a checkpoint or kept weights;
LoRA adapters over their base; the run's compute dtype and lm_head precision), sampled by the
run's own rollout backend and scored by evals/score.py, in one process.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from grpo_ablate.evals.score import evaluate
from grpo_ablate.models import (add_lora, autocast_forward, disable_dropout, load_model_and_tokenizer, model_device,
                                model_dir, stop_token_ids)
from grpo_ablate.rundir.files import EVAL_SCORES
from grpo_ablate.sampling.engines import HFEngine, Rollouts, build_engine
from grpo_ablate.sampling.prompts import PromptEncoder
from grpo_ablate.config.spec import RunSpec
from grpo_ablate.tasks import build_task
from grpo_ablate.train.distributed import DataParallel
from grpo_ablate.train.run import attention_implementation, prepare_process


class Scorer:
    """Scores one step of one run at a time. The start (step 0) is the same weights for every run of
    a model source, and its draws are keyed by the seed: scored once per (source, seed, protocol,
    task) and reused; a vLLM engine is built once per source and given each step's weights."""

    def __init__(self, threads: int | None = None):
        self.threads = threads
        self.starts: dict = {}
        self.engines: dict = {}

    def score(self, spec: RunSpec, run_dir: Path, step: int, weights: Path | None) -> dict:
        """The results row of `step` (evals.jsonl's format, with the completions' length and truncation)."""
        prepare_process(self.threads or spec.threads, spec.seed)
        task = build_task(spec.task)
        model_path = model_dir(spec.model.group, task, log=lambda *_: None)
        start_key = json.dumps([str(model_path), spec.seed, spec.eval.settings(), spec.schedule.eval_max_new_tokens,
                                _plain(spec.task), spec.rollout.backend], sort_keys=True, default=str)
        if weights is None and start_key in self.starts:
            return dict(self.starts[start_key])
        device = model_device(spec.model.group)
        policy, tokenizer = self.policy(spec, model_path, weights, device)
        encode = PromptEncoder(tokenizer, task)
        encode.drop_long_prompts(task, lambda *_: None)   # the eval set the run evaluated (task.max_prompt_tokens)
        dp = DataParallel()
        rollouts = Rollouts(self.engine(spec, policy, model_path, dp), tokenizer, encode, task, dp, device,
                            eos_id=stop_token_ids(policy, tokenizer), max_new_tokens=spec.rollout.max_new_tokens,
                            seed=spec.seed, rng="stream", stream=torch.Generator().manual_seed(spec.seed),
                            filters=spec.rollout.filters)
        result = evaluate(policy, rollouts, task.eval_set(), spec.eval, seed=spec.seed, step=step,
                          max_new_tokens=spec.schedule.eval_max_new_tokens, answer=getattr(task, "answer", None))
        row = {**result[EVAL_SCORES].row(step), "length_mean": result["eval/length_mean"],
               "truncated_frac": result["eval/truncated_frac"]}
        if weights is None:
            self.starts[start_key] = dict(row)
        return row

    @staticmethod
    def policy(spec: RunSpec, model_path, weights: Path | None, device: torch.device):
        """The policy as the run held it at these weights (None: its start), as train/grpo.py loads it."""
        attn = attention_implementation(spec.model.attn_implementation, device)
        lora = spec.model.lora
        model, tokenizer = load_model_and_tokenizer(model_path if lora else weights or model_path,
                                                    attn_implementation=attn)
        if spec.model.disable_dropout:
            disable_dropout(model)
        model = spec.tricks["lm_head"].fn(autocast_forward(model.to(device), spec.model.dtype or "float32"))
        if lora and weights is not None:   # the adapters over their base (a start has none: the base itself)
            model = add_lora(model, spec.model.group, weights)
        return model.eval(), tokenizer

    def engine(self, spec: RunSpec, policy, model_path, dp):
        """The run's rollout backend: the policy itself (hf), or one vLLM engine given these weights."""
        if spec.rollout.backend != "vllm":
            return HFEngine(policy, lean=spec.rollout.lean_decoder, dtype=str(spec.rollout.dtype or "float32"))
        key = str(model_path)
        if key not in self.engines:
            self.engines[key] = build_engine(spec.rollout, spec.model.dtype, spec.seed, policy, dp, model_path)
        else:
            self.engines[key].sync(policy)
        return self.engines[key]


def _plain(group) -> dict:
    return OmegaConf.to_container(group, resolve=True)
