"""Shared DDP plumbing for the train jobs: torchrun env, device/backend choice, rank-0 printing."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    """What torchrun told this process about its place in the job."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int  # torchrun's GROUP_RANK
    master_addr: str
    master_port: int


@dataclass(frozen=True)
class DistContext:
    """An initialised process group: where this rank runs and how it talks."""

    env: DistEnv
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0


@dataclass(frozen=True)
class AmpPlan:
    """How to run mixed precision on one device type."""

    enabled: bool
    dtype: torch.dtype
    use_scaler: bool  # fp16 needs loss scaling; bf16 and fp32 do not


@dataclass(frozen=True)
class ParamCheck:
    """Result of comparing this rank's parameters with every other rank's."""

    identical: bool
    checksum: float
    numel: int


class LaunchError(RuntimeError):
    """Not started by torchrun (missing env variable): says which one and how to launch."""


_REQUIRED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _int_var(environ: Mapping[str, str], name: str, default: str | None = None) -> int:
    raw = environ.get(name, default)
    if raw is None:
        raise LaunchError(f"environment variable {name} is not set: start this script by torchrun")
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"environment variable {name}={raw!r} is not an integer") from None


def read_dist_env(environ: Mapping[str, str]) -> DistEnv:
    """Parse torchrun's environment variables (pure)."""
    missing = [name for name in _REQUIRED if name not in environ]
    if missing:
        raise LaunchError(
            f"environment variable(s) {', '.join(missing)} not set: this script must be started "
            "by torchrun, e.g. `python -m torch.distributed.run --standalone "
            "--nproc-per-node 2 train.py`"
        )
    world_size = _int_var(environ, "WORLD_SIZE")
    return DistEnv(
        rank=_int_var(environ, "RANK"),
        local_rank=_int_var(environ, "LOCAL_RANK"),
        world_size=world_size,
        local_world_size=_int_var(environ, "LOCAL_WORLD_SIZE", str(world_size)),
        node_rank=_int_var(environ, "GROUP_RANK", "0"),
        master_addr=environ["MASTER_ADDR"],
        master_port=_int_var(environ, "MASTER_PORT"),
    )


def select_device(local_rank: int, cuda_available: bool, cuda_device_count: int) -> torch.device:
    """cuda:<local_rank> when CUDA has a GPU for this rank, else cpu (pure)."""
    if not cuda_available or cuda_device_count == 0:
        return torch.device("cpu")
    if local_rank >= cuda_device_count:
        raise LaunchError(
            f"LOCAL_RANK={local_rank} but only {cuda_device_count} GPU(s) are visible: "
            f"lower --nproc-per-node to {cuda_device_count} or fix CUDA_VISIBLE_DEVICES"
        )
    return torch.device("cuda", local_rank)


def select_backend(device: torch.device) -> str:
    """nccl for CUDA devices, gloo otherwise (pure)."""
    return "nccl" if device.type == "cuda" else "gloo"


def select_amp(mode: str, device_type: str) -> AmpPlan:
    """Mixed-precision plan for --amp {off,bf16,fp16} on a device type (pure)."""
    if mode == "off":
        return AmpPlan(enabled=False, dtype=torch.float32, use_scaler=False)
    if mode == "bf16":
        return AmpPlan(enabled=True, dtype=torch.bfloat16, use_scaler=False)
    if mode == "fp16":
        return AmpPlan(enabled=True, dtype=torch.float16, use_scaler=True)
    raise ValueError(f"--amp {mode!r}: expected one of off, bf16, fp16")


def sync_bn_supported(device_type: str) -> bool:
    """torch's SyncBatchNorm runs on CUDA only (on CPU its forward raises) (pure)."""
    return device_type == "cuda"


def threads_per_rank(cpu_count: int, local_world_size: int) -> int:
    """CPU threads each local rank may use so ranks don't oversubscribe the host (pure)."""
    return max(1, cpu_count // max(1, local_world_size))


def init_distributed(timeout_s: float = 300.0) -> DistContext:
    """Init the process group from torchrun's env; set the CUDA device; cap CPU threads."""
    env = read_dist_env(os.environ)
    device = select_device(env.local_rank, torch.cuda.is_available(), torch.cuda.device_count())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(threads_per_rank(os.cpu_count() or 1, env.local_world_size))
    backend = select_backend(device)
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s), **kwargs)
    return DistContext(env=env, device=device, backend=backend)


def cleanup(barrier: bool = False) -> None:
    """Destroy the process group if one is up; barrier first on a clean exit so no rank tears
    down its connections while a peer still has traffic in flight."""
    gc.collect()  # free DDP reducers (reference cycles) while their process group is alive
    if dist.is_available() and dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()
    gc.collect()


def emit(line: str) -> None:
    """Write one whole line in a single write and flush, so ranks' lines never interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def print0(ctx: DistContext, line: str) -> None:
    """emit() on rank 0 only."""
    if ctx.is_main:
        emit(line)


def flat_parameters(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """All tensors as one detached float64 vector."""
    parts = [t.detach().reshape(-1).to(torch.float64) for t in tensors]
    if not parts:
        return torch.zeros(0, dtype=torch.float64)
    return torch.cat(parts)


def checksum(flat: torch.Tensor) -> float:
    """An order-sensitive checksum of a vector: sum of x_i * (1 + i mod 7)."""
    weights = (torch.arange(flat.numel(), device=flat.device) % 7 + 1).to(flat.dtype)
    return float((flat * weights).sum().item())


def check_params_identical(ctx: DistContext, tensors: Iterable[torch.Tensor]) -> ParamCheck:
    """all_gather every rank's parameters and compare them bit for bit with rank 0's."""
    flat = flat_parameters(tensors).to(ctx.device)
    gathered = [torch.empty_like(flat) for _ in range(ctx.env.world_size)]
    dist.all_gather(gathered, flat)
    identical = all(torch.equal(g, gathered[0]) for g in gathered)
    return ParamCheck(identical=identical, checksum=checksum(flat), numel=flat.numel())


def rank_report_line(ctx: DistContext, check: ParamCheck) -> str:
    """The one line each rank prints at the end: identity, placement and parameter check."""
    e = ctx.env
    return (
        f"rank={e.rank} local_rank={e.local_rank} world_size={e.world_size} "
        f"node_rank={e.node_rank} params_identical={check.identical} "
        f"checksum={check.checksum:.10e} device={ctx.device} backend={ctx.backend}"
    )
