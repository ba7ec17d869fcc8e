"""Workers and how they talk: the world layout, joining the process group, and the collectives training uses.

Layout: one worker process per GPU (NCCL), or ``num_workers`` CPU processes (gloo) when no GPU is used. Under torchrun
(RANK, LOCAL_RANK and WORLD_SIZE set) each process *is* a worker: nothing is spawned and multi-node works the same way.
The rendezvous port is chosen once, in the parent, and handed to every rank; MASTER_ADDR / MASTER_PORT are honoured when
set. Starting and supervising the worker processes is `clstm_ppo.training.launch`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from envs.errors import UserError

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


@dataclass
class Comm:
    """This worker's place in the world and the few collectives training needs.

    With ``world_size == 1`` and no process group every collective is the identity, so the same
    trainer code runs in a single process.
    """

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    backend: str = "none"

    @property
    def master(self) -> bool:
        """True on rank 0, the only process that logs and writes files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def _on_backend_device(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device) if self.backend == "nccl" else tensor.cpu()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over workers (a new tensor on ``tensor``'s device)."""
        if not self.distributed:
            return tensor.clone()
        work = self._on_backend_device(tensor).clone()
        dist.all_reduce(work, op=dist.ReduceOp.SUM)
        return work.to(tensor.device)

    def all_reduce_named(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each named tensor summed over workers, in one all-reduce: the tensors (any shapes, on one device) are
        flattened into one float64 buffer in the dict's order, which must be the same on every rank."""
        flat = torch.cat([v.detach().double().reshape(-1) for v in values.values()])
        total = self.all_reduce_sum(flat)
        out, start = {}, 0
        for name, value in values.items():
            out[name] = total[start : start + value.numel()].reshape(value.shape)
            start += value.numel()
        return out

    def all_gather_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Concatenate every worker's ``[k_r, C]`` rows in rank order -> ``[sum k_r, C]``.

        Two fixed-shape collectives: the counts, then the rows padded to the largest count.
        """
        if not self.distributed:
            return rows.clone()
        local = self._on_backend_device(rows)
        count = torch.tensor([local.shape[0]], device=local.device, dtype=torch.long)
        counts = [torch.zeros_like(count) for _ in range(self.world_size)]
        dist.all_gather(counts, count)
        sizes = [int(c.item()) for c in counts]
        padded = torch.zeros((max(sizes), rows.shape[1]), dtype=local.dtype, device=local.device)
        padded[: local.shape[0]] = local
        gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(gathered, padded)
        return torch.cat([g[:n] for g, n in zip(gathered, sizes, strict=True)]).to(rows.device)

    def gather_objects(self, obj: Any) -> list[Any] | None:
        """Every worker's picklable ``obj`` on rank 0 (a list in rank order); None elsewhere."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size if self.master else None
        dist.gather_object(obj, out, dst=0)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every worker."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def find_free_port() -> int:
    """A TCP port free on this machine right now (asked of the OS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class WorldLayout:
    """How many workers, on what, and where they meet."""

    world_size: int
    device_type: str  # "cuda" or "cpu"
    backend: str  # "nccl" or "gloo" ("none" for one process)
    master_addr: str
    master_port: int
    torchrun: bool

    def describe(self, num_envs: int) -> str:
        where = f"{self.world_size} x GPU" if self.device_type == "cuda" else f"{self.world_size} x CPU process"
        return (
            f"world size {self.world_size} ({where}), backend {self.backend}, "
            f"{num_envs} envs per worker = {num_envs * self.world_size} envs, "
            f"rendezvous {self.master_addr}:{self.master_port}{' (torchrun)' if self.torchrun else ''}"
        )


def resolve_layout(num_gpus: int | None, num_workers: int, backend: str, master_port: int) -> WorldLayout:
    """Decide world size, device and backend from the flags and what the machine has."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if all(name in os.environ for name in TORCHRUN_VARS):  # launched by torchrun
        world = int(os.environ["WORLD_SIZE"])
        device_type = "cuda" if visible and num_gpus != 0 else "cpu"
        port = int(os.environ.get("MASTER_PORT", "0"))
        torchrun = True
    else:
        wanted = visible if num_gpus in (None, -1) else num_gpus
        if wanted < 0:
            raise UserError(f"--num_gpus must be -1 (all), 0 (CPU) or a positive count, got {num_gpus}")
        if wanted > visible:
            raise UserError(f"--num_gpus {wanted} asked for, but this machine has {visible} visible CUDA GPU(s)")
        device_type = "cuda" if wanted > 0 else "cpu"
        world = wanted if wanted > 0 else num_workers
        port = master_port or int(os.environ.get("MASTER_PORT", "0") or 0) or (find_free_port() if world > 1 else 0)
        torchrun = False
    if backend == "auto":
        backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl" and device_type != "cuda":
        raise UserError("--backend nccl needs CUDA GPUs; use gloo (the default) for CPU workers")
    if world == 1 and not torchrun:
        backend = "none"
    return WorldLayout(world, device_type, backend, addr, port, torchrun)


def init_worker(layout: WorldLayout, rank: int, local_rank: int) -> Comm:
    """Join the process group (when there is more than one worker) and pick this worker's device."""
    if layout.device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if layout.backend != "none":
        os.environ["MASTER_ADDR"] = layout.master_addr
        os.environ["MASTER_PORT"] = str(layout.master_port)
        dist.init_process_group(
            layout.backend,
            rank=rank,
            world_size=layout.world_size,
            timeout=timedelta(minutes=10),
            **({"device_id": device} if layout.backend == "nccl" else {}),
        )
    return Comm(rank=rank, world_size=layout.world_size, device=device, backend=layout.backend)


def shutdown_worker() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
