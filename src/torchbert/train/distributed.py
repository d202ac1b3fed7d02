"""Data parallelism on PyTorch's own engine: torchrun starts the processes, DDP or FSDP2 wraps the model.

    torchrun --nproc-per-node 4 -m torchbert pretrain --data DIR --out DIR ...          # DDP
    torchrun --nproc-per-node 8 -m torchbert pretrain --data DIR --out DIR --fsdp ...   # FSDP2

Each process reads its own slice of every global batch (PretrainingData(rank=, world_size=)).
Losses are normalized by the target counts of the whole global batch (summed over processes
before the backward pass); DDP and FSDP average gradients over processes, so each process scales
its loss by the world size, and k processes take exactly the step one process would take on the
same global batch. Process 0 writes checkpoints and the run folder; all processes read them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    fsdp: bool = False

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce(self, values: list[float], device: torch.device) -> list[float]:
        """Sums over processes (identity in a single process)."""
        if not self.enabled:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.tolist()

    def all_reduce_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A sum over processes that stays on the device (no host read; t itself in a single process)."""
        if not self.enabled:
            return t
        t = t.clone()
        dist.all_reduce(t)
        return t

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def broadcast_object(self, value):
        """Process 0's `value` (a path, a small record of our own) on every process."""
        if not self.enabled:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def __enter__(self) -> Dist:
        return self

    def __exit__(self, kind, *_) -> None:
        self.close(finished=kind is None)

    def close(self, finished: bool) -> None:
        """Leave the process group; each process calls it before it exits, however its run ended
        (`with dist:` does). Gloo's worker threads must be done with every collective while the
        interpreter is still whole: a worker that drops a finished all-gather's tensors needs the
        GIL, and one that asks for it during the interpreter's finalization aborts the process
        ("terminate called without an active exception"; a core dump of an FSDP2 run on a busy host
        showed ProcessGroupGloo::runLoop destroying an AsyncAllgatherCoalescedWork in Py_FinalizeEx).
        destroy_process_group does not stop those threads (DTensor's caches keep FSDP2's device
        mesh, and with it the group, alive), so a run that finished waits at a barrier first: the
        GIL is free while it waits, the slowest process (process 0, writing the last files) is done
        before any leaves, and no process exits moments after its last collective. A run that
        failed leaves at once (the others may be gone; torchrun stops them)."""
        if not (self.enabled and dist.is_initialized()):
            return
        if finished:
            dist.barrier()
        dist.destroy_process_group()


def init_distributed(device_name: str = "auto", fsdp: bool = False) -> tuple[Dist, torch.device]:
    """Join the process group that torchrun describes in the environment (or run alone)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        if fsdp:
            raise ValueError("--fsdp needs several processes: start the run with torchrun --nproc-per-node N")
        return Dist(), _device(device_name, 0)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device = _device(device_name, local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world_size, local_rank, fsdp), device


def _device(name: str, local_rank: int) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device(name)


def wrap(model: nn.Module, d: Dist, device: torch.device) -> nn.Module:
    """DDP, or FSDP2 (each encoder layer sharded on its own, then the whole model)."""
    if not d.enabled:
        return model
    if d.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model.bert.layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def full_state_dict(model: nn.Module, d: Dist) -> dict[str, torch.Tensor]:
    """The whole model's state on the CPU (gathered from the shards under FSDP)."""
    if d.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}


def full_optimizer_state(model: nn.Module, optimizer, d: Dist) -> dict:
    if d.fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return optimizer.state_dict()


def load_full_state(model: nn.Module, optimizer, model_state: dict, optim_state: dict, d: Dist) -> None:
    if d.fsdp:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                             set_optimizer_state_dict)

        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        set_model_state_dict(model, model_state, options=opts)
        set_optimizer_state_dict(model, optimizer, optim_state, options=opts)
        return
    unwrap(model).load_state_dict(model_state)
    optimizer.load_state_dict(optim_state)
