"""Data-parallel training of one run over several processes (torchrun), and its one-process no-op.

The design: docs/fsdp.md, "Data-parallel training: how the work is split".
"""
from __future__ import annotations

import os
from contextlib import nullcontext

import torch
import torch.distributed as dist

from grpo_ablate.train import fsdp
from grpo_ablate.rundir.ranks import launched_ranks


class DataParallel:
    def __init__(self, fsdp: bool = False):
        self.world = launched_ranks()   # a SLURM job step's tasks become torchrun's variables first
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.fsdp = fsdp and self.world > 1   # model.fsdp=true: sharded, not replicated
        self.started = False
        self.device = torch.device("cpu")   # where collectives' tensors live (nccl: this GPU)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def start(self, device: torch.device) -> None:
        """Join the process group (torchrun's env:// rendezvous)."""
        self.device = device
        if self.world == 1 or dist.is_initialized():
            return
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        self.started = True

    def stop(self) -> None:
        if self.started and dist.is_initialized():
            dist.barrier()    # no rank tears the group down while another one still uses it
            dist.destroy_process_group()
            self.started = False

    # -- splitting ------------------------------------------------------------------------------
    def share(self, n: int) -> slice:
        """This rank's contiguous share of n items (the first ranks take one more if uneven)."""
        if self.world == 1:
            return slice(0, n)
        base, extra = divmod(n, self.world)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (self.rank < extra))

    def part(self, tensor):
        """This rank's rows of a tensor over the whole batch (None stays None)."""
        if self.world == 1 or tensor is None:
            return tensor
        return tensor[self.share(tensor.shape[0])]

    # -- collecting -----------------------------------------------------------------------------
    def gather_objects(self, obj) -> list:
        """Every rank's `obj`, in rank order (picklable; tensors travel on the CPU)."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def gather_rows(self, tensor):
        """The whole batch's rows from every rank's `part` (None stays None)."""
        return gather_rows(tensor, self.world)

    def sum(self, value: float) -> float:
        """A number summed over ranks (the step's loss: each rank holds its part)."""
        if self.world == 1:
            return value
        total = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(total)
        return float(total)

    def broadcast(self, obj):
        """Rank 0's `obj` on every rank (the run dir Hydra made on rank 0)."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def main_first(self, fn):
        """Run `fn` on rank 0, then on the others (a cache rank 0 fills, the others then find)."""
        if self.world == 1:
            return fn()
        if self.is_main:
            result = fn()
        dist.barrier()
        if not self.is_main:
            result = fn()
        return result

    # -- the model and its gradients ------------------------------------------------------------
    def shard(self, model):
        """model.fsdp=true: `model` sharded over the ranks in place (before an optimizer sees its
        parameters); otherwise `model` as it is."""
        return fsdp.shard(model) if self.fsdp else model

    def sharding(self, model) -> str | None:
        """One line on how `model` is sharded (None: it is not)."""
        return fsdp.describe(model) if self.fsdp else None

    def wrap(self, model):
        """The model the loss's forward pass runs through: DDP over ranks, itself in one process
        (and under FSDP, whose sharded model reduces its own gradients)."""
        if self.world == 1 or self.fsdp:
            return model
        import inspect

        from torch.nn.parallel import DistributedDataParallel

        device = next(model.parameters()).device
        # buffers (rotary tables) are equal on every rank: no need to sync them at every forward
        quiet = ("forward_sync_buffers"
                 if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                 else "broadcast_buffers")
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       **{quiet: False})

    def unsharded(self, model):
        """A context in which `model` holds its full weights (FSDP: gathered for a rollout)."""
        return fsdp.unsharded(model) if self.fsdp else nullcontext(model)

    def average_grads(self, params) -> None:
        """Average the gradients of parameters outside the DDP or FSDP model (as it does for its own)."""
        if self.world == 1:
            return
        for p in params:
            if p.grad is not None:
                grad = p.grad.to(self.device)   # nccl reduces GPU tensors only (a learnable T is on the CPU)
                dist.all_reduce(grad)
                p.grad.copy_(grad / self.world)

    def clip_grad_norm(self, params, max_norm: float) -> float:
        """Clip the gradients of `params` to a total norm of max_norm; the norm before clipping."""
        if self.fsdp:
            return fsdp.clip_grad_norm(params, max_norm)
        return torch.nn.utils.clip_grad_norm_(params, max_norm).item()

    # -- checkpoints ------------------------------------------------------------------------------
    def full_weights(self, model) -> dict | None:
        """FSDP: the model's full weights for its checkpoint, on rank 0 (a collective: every rank
        calls it). Otherwise None: the model's own state_dict is whole."""
        return fsdp.full_weights(model) if self.fsdp else None

    def checkpoint_full_optimizer_state(self, optimizer) -> None:
        """FSDP: from now on `optimizer`'s state_dict() gathers its shards to rank 0 (every rank
        calls it) and load_state_dict() takes that full state back; otherwise nothing to do."""
        if self.fsdp:
            fsdp.checkpoint_full_optimizer_state(optimizer)


def gather_rows(tensor, world: int):
    """The whole batch's rows from every one of `world` ranks' parts, in rank order (None stays None)."""
    if world == 1 or tensor is None:
        return tensor
    size = torch.tensor([tensor.shape[0]], device=tensor.device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size)                         # all_gather needs equal shapes: pad
    padded = torch.zeros((int(max(sizes)), *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    padded[:tensor.shape[0]] = tensor.detach()
    pieces = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(pieces, padded)
    return torch.cat([piece[:int(n)] for piece, n in zip(pieces, sizes)])
