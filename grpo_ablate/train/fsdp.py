"""FSDP (model.fsdp=true): one run's model sharded over the processes of torchrun or a SLURM job step.

The design: docs/fsdp.md, "How the model is sharded".
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from grpo_ablate.errors import ConfigError


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """Shard `model` in place over all processes: each transformer block, then the root.
    Before any optimizer sees its parameters (they become DTensors)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model   # a LoRA model's transformer
    block_names = set(getattr(base, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in block_names]
    if not blocks:
        raise ConfigError(f"model.fsdp=true cannot find the transformer blocks of {type(base).__name__} "
                          "(it names none in _no_split_modules); train it without model.fsdp")
    for block in reversed(blocks):   # innermost first: a unit never holds a later unit's parameters
        fully_shard(block)
    fully_shard(model)
    return model


def describe(model: torch.nn.Module) -> str:
    """One line for the console: how the model is sharded."""
    units = sum(isinstance(m, FSDPModule) for m in model.modules())
    total = sum(p.numel() for p in model.parameters())
    mine = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in model.parameters())
    return (f"model.fsdp: the policy is sharded over {dist.get_world_size()} processes in {units} units; "
            f"this process holds {mine:,} of its {total:,} parameters")


@contextmanager
def unsharded(model: torch.nn.Module):
    """`model` with its full weights in place (plain tensors, not DTensors) for the block: every
    unit gathered on entry, kept through any forward inside, freed on exit."""
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]   # the root comes first
    model.set_reshard_after_forward(False)    # every unit: a forward inside keeps its weights
    for unit in units:
        unit.unshard()
    try:
        yield model
    finally:
        for unit in units:
            unit.reshard()
        # training's defaults again: a block frees its weights after forward, the root (whose
        # weights backward needs first) keeps them
        for unit in units[1:]:
            unit.set_reshard_after_forward(True, recurse=False)


def full_weights(model: torch.nn.Module) -> dict:
    """The model's full state dict on rank 0's CPU ({} on the other ranks; every rank must call
    it). A LoRA model's frozen base is left out: its checkpoint holds the adapters only."""
    weights = get_model_state_dict(model, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True, ignore_frozen_params=hasattr(model, "peft_config")))
    # a tied parameter (embeddings = LM head) comes back as two copies: make them one tensor
    # again, so save_pretrained drops the tied name as it does from the model's own state dict
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    for first, *aliases in names.values():
        for alias in aliases:
            if first in weights and alias in weights:
                weights[alias] = weights[first]
    return weights


def checkpoint_full_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Make (in place, by hooks) `optimizer.state_dict()` gather its sharded state to full
    tensors on rank 0's CPU (a collective: every rank calls it; the others get None in their
    place), and `optimizer.load_state_dict()` take such a full state, keeping this rank's shard."""
    optimizer.register_state_dict_post_hook(_gathered)
    optimizer.register_load_state_dict_pre_hook(_scattered)


def _gathered(optimizer, state_dict: dict) -> dict:
    is_main = dist.get_rank() == 0

    def full(value):
        if not isinstance(value, DTensor):
            return value
        value = value.full_tensor()     # every rank, in the same order (the state's own)
        return value.cpu() if is_main else None

    # new dicts: the packed state's inner dicts are the optimizer's live ones
    return {**state_dict, "state": {index: {key: full(value) for key, value in per_param.items()}
                                    for index, per_param in state_dict["state"].items()}}


def _scattered(optimizer, state_dict: dict) -> dict:
    params = [p for group in optimizer.param_groups for p in group["params"]]   # the state's indices

    def local(value, param):
        if not (isinstance(param, DTensor) and torch.is_tensor(value) and value.shape == param.shape):
            return value    # a step count, or a parameter kept whole
        # each rank read the same full tensor: it takes its shard, no communication
        return distribute_tensor(value.to(param.device), param.device_mesh, param.placements, src_data_rank=None)

    return {**state_dict, "state": {index: {key: local(value, params[index]) for key, value in per_param.items()}
                                    for index, per_param in state_dict["state"].items()}}


def clip_grad_norm(params, max_norm: float) -> float:
    """`torch.nn.utils.clip_grad_norm_` over sharded and whole gradients together (a policy's
    DTensors and a value head's plain tensors cannot share one foreach op): the total norm of
    all of them, every gradient scaled by the same factor. Returns the norm before clipping."""
    with_grad = [p for p in params if p.grad is not None]
    groups = [[p for p in with_grad if isinstance(p.grad, DTensor)],
              [p for p in with_grad if not isinstance(p.grad, DTensor)]]
    norms = []
    for group in groups:
        if group:
            norm = torch.nn.utils.get_total_norm([p.grad for p in group])
            norms.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).float().cpu())
    if not norms:
        return 0.0
    total = torch.linalg.vector_norm(torch.stack(norms))
    for group in groups:
        if group:
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total.to(group[0].grad.device))
    return total.item()
