"""Models and tokenizers: the embedded tiny default and any Hugging Face causal LM by path.

Both go through `AutoModelForCausalLM.from_pretrained(path)`: the embedded default is built
from a transformers config, warm-started once by a short supervised pass, saved to a
content-addressed cache directory and loaded from there like any real checkpoint.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
import types
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast,
                          Qwen2Config, Qwen2ForCausalLM)
from transformers.utils import logging as hf_logging

from grpo_ablate.model_source import ModelPathError, gguf_source, local_path, warm_start_dir
from grpo_ablate.rundir.lock import BuildLock
from grpo_ablate.rundir.paths import cache_message, writable_problem

# Loading and saving tiny checkpoints many times a run: no per-file progress bars.
hf_logging.disable_progress_bar()

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")


def build_char_tokenizer(chars: str) -> PreTrainedTokenizerFast:
    """Character-level tokenizer: `<pad>`=0, `<bos>`=1, `<eos>`=2, then `chars` in order.

    One id per character (W1's construction: WordLevel over single characters, a regex split
    that isolates every character, a Fuse decoder, no post-processor), so "12+34=" is 6 ids
    and decoding is exact string concatenation.
    """
    if len(set(chars)) != len(chars):
        raise ValueError(f"tokenizer characters must be unique, got {chars!r}")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    vocab.update({ch: len(SPECIAL_TOKENS) + i for i, ch in enumerate(chars)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )


# ---------------------------------------------------------------------------------------
# The embedded default: a tiny Qwen2-shaped model, warm-started on the task, cached on disk
# ---------------------------------------------------------------------------------------
def build_tiny_model(arch: dict, tokenizer, seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tokenizer), tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, **arch)
    return Qwen2ForCausalLM(config).float()


def supervised_batch(tokenizer, prompts: list, targets: list[str], device="cpu"):
    """prompt + target + EOS, right-padded; labels only on the target and EOS. A prompt is its
    text, or its token ids as already encoded (e.g. through a chat template). A target is its text,
    or a multi-turn demonstration's (text, imitated) segments: an environment's reply (imitated
    False) is context without a label, each segment encoded on its own as the rollout appends it."""
    rows, labels = [], []
    for prompt_text, target in zip(prompts, targets):
        prompt = (tokenizer(prompt_text, add_special_tokens=False).input_ids if isinstance(prompt_text, str)
                  else list(prompt_text))
        answer, label = [], []
        for text, imitated in ([(target, True)] if isinstance(target, str) else target):
            ids = tokenizer(text, add_special_tokens=False).input_ids
            answer, label = answer + ids, label + (ids if imitated else [-100] * len(ids))
        answer, label = answer + [tokenizer.eos_token_id], label + [tokenizer.eos_token_id]
        rows.append(prompt + answer)
        labels.append([-100] * len(prompt) + label)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lb) in enumerate(zip(rows, labels)):
        ids[i, :len(r)], lab[i, :len(lb)], mask[i, :len(r)] = torch.tensor(r), torch.tensor(lb), 1
    return ids.to(device), mask.to(device), lab.to(device)


def warm_start(model, tokenizer, task, steps: int, batch_size: int, lr: float, seed: int,
               slip_prob: float = 0.0, log=print) -> None:
    """Short supervised pass on the task's reference solutions: deterministic in `seed`.

    Deliberately short: the point is a policy that sometimes solves the task (so groups have
    reward variance) and has room left for RL to improve it.
    """
    rng = random.Random(f"warmup/{seed}")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup_steps = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup_steps) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    model.train()
    for step in range(steps):
        problems = task.warmup_batch(batch_size, rng)
        demonstrate = getattr(task, "demonstration_turns", task.demonstration)   # a multi-turn task's segments
        targets = [demonstrate(p, rng, slip_prob) for p in problems]
        ids, mask, labels = supervised_batch(tokenizer, [p.prompt for p in problems], targets)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        if (step + 1) % max(1, steps // 5) == 0:
            log(f"warm-up step {step + 1}/{steps}  loss {loss.item():.3f}")


def ensure_warm_started(model_cfg, task, log=print) -> Path:
    """Path of the cached warm-started tiny model, building it first if it is missing.

    The cache entry is content-addressed, so a changed architecture, task or warm-up config
    never loads a stale model; it is written to a temporary directory and renamed into place,
    so a killed build leaves no half-written entry, and built by one process at a time (`built_once`):
    two commands started together on a fresh machine build it once.
    """
    target = warm_start_dir(model_cfg, task)
    arch, warmup = dict(model_cfg.arch), dict(model_cfg.warmup)
    return built_once(target, lambda: _warm_start_entry(arch, warmup, task, target, log), log)


def built_once(target: Path, build, log=print) -> Path:
    """The cache entry `target`, built by `build()` unless it is there. One process builds an entry at
    a time (rundir.lock.BuildLock): another that wants it meanwhile says once whom it waits for, waits,
    and finds it built; a builder killed midway leaves the next one to build it."""
    if (target / "config.json").exists():
        return target
    problem = writable_problem(target.parent)
    if problem:   # config.check_here refuses this before a run; here: an entry not cached yet in a read-only
        raise ModelPathError(cache_message(target.parent, problem))   # cache (or GRPO_ABLATE_CACHE a file)
    target.parent.mkdir(parents=True, exist_ok=True)
    with BuildLock(target, say=log):
        if not (target / "config.json").exists():   # else: built by the process we waited for
            build()
    return target


def _warm_start_entry(arch: dict, warmup: dict, task, target: Path, log) -> Path:
    """Build the embedded model's cache entry `target`: the tiny model, warm-started on `task`."""
    key = target.name[len("tiny-"):]
    log(f"warm-starting the embedded tiny model (cached as {target})")
    started = time.perf_counter()
    tokenizer = build_char_tokenizer(task.chars)
    model = build_tiny_model(arch, tokenizer, seed=int(warmup["seed"]))
    warm_start(model, tokenizer, task, steps=int(warmup["steps"]),
               batch_size=int(warmup["batch_size"]), lr=float(warmup["lr"]),
               seed=int(warmup["seed"]), slip_prob=float(warmup.get("slip_prob", 0.0)), log=log)
    return save_cache_entry(model, tokenizer, target, "warm_start.json",
                            {"key": key, "arch": arch, "warmup": warmup, "task": task.describe(),
                             "seconds": round(time.perf_counter() - started, 1)})


def save_cache_entry(model, tokenizer, target: Path, about_file: str, about: dict) -> Path:
    """Save a model and its tokenizer as the cache entry `target` (with `about` as JSON beside
    them): written to a temporary folder and renamed into place, so a killed build leaves no
    half-written entry and parallel builders never collide."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / about_file).write_text(json.dumps(about, indent=2))
        os.rename(tmp, target)
    except OSError:
        if not (target / "config.json").exists():
            raise
        # another process finished the same entry first (a file system without locks): theirs is kept,
        # so every process loads the one entry
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


# ---------------------------------------------------------------------------------------
# GGUF checkpoints (model.gguf_file, or model.path=<file>.gguf): converted once, cached
# ---------------------------------------------------------------------------------------
# Bump when the conversion changes, so old cache entries are never reused.
GGUF_VERSION = 1


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_gguf_converted(file: Path, cache_dir, log=print) -> Path:
    """A from_pretrained directory holding the GGUF file's model, dequantized to float32, with
    its tokenizer and chat template; converted once (transformers + the `gguf` package, ~1 min
    for SmolLM2-135M on 2 cores) and cached under cache_dir, content-addressed by the file's
    bytes, the conversion and the transformers release. Written to a temporary folder and
    renamed into place, as the embedded model's entry. Nothing is downloaded."""
    import transformers

    key = hashlib.sha256(json.dumps({"version": GGUF_VERSION, "file": _file_digest(file),
                                     "transformers": transformers.__version__}).encode()).hexdigest()[:16]
    cache_root = Path(os.path.expanduser(str(cache_dir)))
    target = cache_root / f"gguf-{file.stem}-{key}"
    return built_once(target, lambda: _convert_gguf(file, key, target, log), log)


def _convert_gguf(file: Path, key: str, target: Path, log) -> Path:
    """Build the cache entry `target`: the GGUF file's model dequantized, with its tokenizer."""
    import transformers

    log(f"converting {file.name} to a transformers model, once (cached as {target})")
    started = time.perf_counter()
    folder, name = str(file.parent), file.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                      local_files_only=True)
    except (OSError, ValueError, ImportError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelPathError(f"{file} could not be loaded as a GGUF model: {first}") from None
    # The loaded model carries a `gguf` quantization config and refuses save_pretrained: its
    # weights are already dequantized, so they move into a plain model of the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    del loaded
    save_cache_entry(model, tokenizer, target, "gguf_source.json",
                     {"key": key, "file": str(file), "transformers": transformers.__version__,
                      "seconds": round(time.perf_counter() - started, 1)})
    log(f"converted in {time.perf_counter() - started:.0f} s")
    return target


def model_dir(model_cfg, task=None, log=print):
    """The from_pretrained source of a model config: the cached conversion of its GGUF file,
    model.path (a folder, `pkg:<package>`, or a hub name), or the embedded tiny model
    (warm-started on `task` when not cached yet)."""
    gguf = gguf_source(model_cfg)
    if gguf is not None:
        cache = model_cfg.get("cache_dir") or os.environ.get("GRPO_ABLATE_CACHE", "~/.cache/grpo-ablate")
        return ensure_gguf_converted(gguf, cache, log=log)
    if model_cfg.get("path"):
        return local_path(model_cfg.path)
    return ensure_warm_started(model_cfg, task, log=log)


def weights_digest(model: torch.nn.Module) -> str:
    """What a model's weights are, in 16 hex digits: sha256 over its state dict, tensor by tensor in
    name order (name, dtype, shape, bytes). Equal weights give the same digest on every machine, weights
    one bit apart another (the embedded model's warm start follows the CPU's kernels). Reads every
    weight once: well under a second for the embedded model, ~1 s a GB."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
    return digest.hexdigest()[:16]


def started_from(group, model_path, weights: str) -> dict:
    """status.json's record of a run's start (`group`: its model group): its weights' digest, and where
    they were loaded from, named alike on every machine (model.path as given, or the cache entry's
    content address: the embedded model's warm start, a GGUF file's conversion), so that runs which
    asked for one start and got two are found (rundir/starts.py)."""
    asked = str(group.path) if group.get("path") and gguf_source(group) is None else Path(model_path).name
    return {"weights": weights, "model": asked}


def load_tokenizer(path: str | os.PathLike):
    """AutoTokenizer, except for a plain `tokenizers` tokenizer saved as such (the embedded
    character tokenizer, W1's): AutoTokenizer would swap in the architecture's own tokenizer
    class (Qwen2Tokenizer for a qwen2 config), which rewrites its pre-tokenizer."""
    config = Path(path) / "tokenizer_config.json"
    if config.exists() and json.loads(config.read_text()).get("tokenizer_class") in (
            "PreTrainedTokenizerFast", "TokenizersBackend"):
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


def load_model_and_tokenizer(path: str | os.PathLike, attn_implementation: str | None = None):
    """Load any causal LM the way a user's real model is loaded (float32 weights, on the CPU)."""
    try:
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                     attn_implementation=attn_implementation)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        hint = ""
        if not Path(os.path.expanduser(str(path))).exists():
            hint = (" (not a local directory, and no copy in the Hugging Face cache; download it "
                    "where there is network, or give a directory with a saved transformers model)")
        raise ModelPathError(f"model.path={path!r} could not be loaded: {first}{hint}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token  # common for base LMs; left padding is masked
    tokenizer.padding_side = "left"  # prompts are left-padded for generation (rollout.left_pad)
    return model, tokenizer


# ---------------------------------------------------------------------------------------
# Real models (model=hf): device, mixed precision, gradient checkpointing, LoRA
# ---------------------------------------------------------------------------------------
# model.dtype: the compute dtype. Weights (the master copy AdamW updates) stay float32.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def model_device(model_cfg, local_rank: int = 0) -> torch.device:
    """model.device: auto = this process's GPU when there is one, else the CPU. The embedded
    tiny model (no `device` key) always trains on the CPU, where it is fastest."""
    choice = str(model_cfg.get("device") or "cpu")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device("cuda", local_rank) if choice == "cuda" else torch.device(choice)


def autocast_forward(model, dtype: str):
    """model.dtype=bfloat16|float16: the model's forward runs under torch.autocast (matmuls in
    low precision, reductions and softmax in float32) while its weights stay float32, the
    master copy the optimizer updates; accelerate's mixed precision wraps forward the same
    way. float32 leaves the model untouched (no per-step cost). Bound as a method, so a
    deepcopy (the reference policy) is wrapped too and runs its own weights."""
    if dtype == "float32":
        return model
    device_type = next(model.parameters()).device.type
    forward = torch.autocast(device_type, dtype=DTYPES[dtype])(type(model).forward)
    model.forward = types.MethodType(forward, model)
    return model


def enable_activation_checkpointing(model) -> None:
    """model.gradient_checkpointing: recompute activations in backward (less memory, more time);
    non-reentrant, so frozen inputs (LoRA) need no special care. transformers >= 5.2x renamed
    gradient_checkpointing_enable to activation_checkpointing_enable."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def add_lora(model, model_cfg, checkpoint: Path | None = None):
    """Wrap `model` with trainable LoRA adapters (peft); only the adapters train. On resume the
    adapters come back from the run's checkpoint, which holds just them (base: model.path)."""
    from omegaconf import OmegaConf
    from peft import LoraConfig, PeftModel, get_peft_model

    if checkpoint is not None:
        return PeftModel.from_pretrained(model, str(checkpoint), is_trainable=True)
    lora = OmegaConf.to_container(model_cfg.lora, resolve=True) if not isinstance(model_cfg.lora, dict) \
        else dict(model_cfg.lora)
    return get_peft_model(model, LoraConfig(
        r=int(lora["r"]), lora_alpha=float(lora["alpha"]), lora_dropout=float(lora["dropout"]),
        target_modules=lora["target_modules"], task_type="CAUSAL_LM"))


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout probability in `model` to 0 (model.disable_dropout, on by default).

    Why: the trainer runs the policy in training mode, so with dropout pi_old, pi_theta and the
    sampler would each see a different random sub-network, and the ratio, the clip fractions
    and the KL to the (eval-mode) reference would measure dropout noise instead of the update.
    As TRL's `disable_dropout_in_model`, every `nn.Dropout` gets p = 0; beyond TRL, attention
    modules that apply dropout functionally from a float `attention_dropout` attribute (Llama,
    Qwen2, Mistral in transformers) get 0 there too, so the whole network is deterministic.
    TRL's GRPOConfig defaults to False (its DPOConfig to True); verl's model configs set the
    dropouts to 0. Returns how many places were changed. LoRA's own dropout is applied after
    this (model.lora.dropout) and is left as configured."""
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout) and module.p != 0:
            module.p, changed = 0.0, changed + 1
        if isinstance(getattr(module, "attention_dropout", None), float) and module.attention_dropout != 0:
            module.attention_dropout, changed = 0.0, changed + 1
    return changed


class AdapterDisabled:
    """The reference policy of a LoRA run: the policy itself with its adapters switched off,
    i.e. the frozen base model, with no second copy in memory. Called like a model; runs in
    eval mode (no dropout), as a separately loaded reference would."""

    def __init__(self, peft_model):
        self.model = peft_model

    @property
    def config(self):   # the model's own: how it may be called (packed rows) is the policy's
        return self.model.config

    def __call__(self, **inputs):
        was_training = self.model.training
        self.model.eval()
        try:
            with self.model.disable_adapter():
                return self.model(**inputs)
        finally:
            self.model.train(was_training)


def stop_token_ids(model, tokenizer) -> int | list[int]:
    """Ids that end a completion: the tokenizer's EOS plus the generation config's (chat models
    end a turn with e.g. <|im_end|> while their EOS is <|endoftext|>). One id stays an int."""
    ids = [tokenizer.eos_token_id]
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += extra if isinstance(extra, (list, tuple)) else [extra]
    ids = list(dict.fromkeys(i for i in ids if i is not None))
    return ids[0] if len(ids) == 1 else ids
