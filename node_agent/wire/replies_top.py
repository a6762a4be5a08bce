"""Node agent replies (declared once: node_agent/wire/replies.py): the top op's and the `sample` events."""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class GpuStat:
    """One GPU as nvidia-smi's query showed it (None: the GPU does not report that field). A GPU
    the driver cannot reach (lost after an Xid 79) has only its bus id and its error."""

    index: Optional[int]
    uuid: Optional[str]
    name: Optional[str]
    util_pct: Optional[float]
    memory_used_mib: Optional[float]
    memory_total_mib: Optional[float]
    power_w: Optional[float]
    error: Optional[str] = None
    bus_id: Optional[str] = None

    @property
    def label(self) -> str:
        return "GPU %s" % self.index if self.index is not None else "GPU %s" % (self.bus_id or "?")


def selected_gpus(gpus: Sequence[GpuStat], select: Optional[Sequence[str]]) -> List[GpuStat]:
    """The GPUs a node's CUDA_VISIBLE_DEVICES names (indices, or UUIDs and their prefixes), and
    every GPU the driver cannot reach (its index is unknown: it may be one of them)."""
    if select is None:
        return list(gpus)
    picked = []
    for g in gpus:
        by_index = g.index is not None and str(g.index) in select
        by_uuid = g.uuid is not None and any(s.startswith(("GPU-", "MIG-")) and g.uuid.startswith(s) for s in select)
        if by_index or by_uuid or g.index is None:
            picked.append(g)
    return picked


@dataclass(frozen=True)
class RankSteps:
    """A rank's step record as the host read it: steps/s over its last window (0: the record is
    stale, the rank stalled), its step time's p50/p95, how old the record is (the host's clock)."""

    rank: Optional[int]
    local_rank: Optional[int]
    step: Optional[int]
    total: Optional[int]
    age_s: Optional[float]
    steps_per_s: Optional[float]
    p50_ms: Optional[float]
    p95_ms: Optional[float]
    stalled: bool


@dataclass(frozen=True)
class TopNode:
    """One node of a job on a host, sampled by the top op over its interval."""

    job_id: str
    job_name: Optional[str]
    node_rank: Optional[int]
    running: bool
    status: str  # "running", or how the node's state ended ("exited", ...)
    exit_code: Optional[int]
    ranks_alive: int
    ranks_expected: Optional[int]  # torchrun's --nproc-per-node
    ranks: Tuple[RankSteps, ...]
    log_age_s: Optional[float]  # since the node's output.log last grew
    iface: Optional[str]  # the interface(s) its collectives use, comma-separated
    iface_source: Optional[str]  # why that one: NCCL_SOCKET_IFNAME=..., GLOO_SOCKET_IFNAME=..., route to ...
    tx_bytes_per_s: Optional[float]
    rx_bytes_per_s: Optional[float]
    cpu_pct: Optional[float]  # of one core, over the job's processes
    rss_bytes: Optional[int]
    processes: int
    gpu_select: Optional[Tuple[str, ...]]  # its CUDA_VISIBLE_DEVICES (indices or UUIDs); None: every GPU


@dataclass(frozen=True)
class HostTop:
    """The top op's answer for one host: its GPUs once, and each node of a job it runs."""

    hostname: str
    interval_s: float
    gpus: Tuple[GpuStat, ...]
    gpu_error: Optional[str]  # nvidia-smi failed for the whole host (NVML could not start, ...)
    nvidia_smi: bool  # nvidia-smi is installed there
    proc_source: Optional[str]  # "psutil" or "/proc" (None: no process was sampled)
    nodes: Tuple[TopNode, ...]
    host: str = ""


@dataclass(frozen=True)
class HostSample:
    """A node supervisor's `sample` event: its job's processes' CPU (% of one core) and memory, and
    the job's GPUs as nvidia-smi showed them (none on a CPU host; `gpu_error`: nvidia-smi failed)."""

    cpu_percent: Optional[float]
    rss_bytes: Optional[int]
    gpus: Tuple[GpuStat, ...] = ()
    gpu_error: Optional[str] = None
    gpu_select: Optional[Tuple[str, ...]] = None  # the job's CUDA_VISIBLE_DEVICES; None: every GPU
    processes: int = 0

    @property
    def job_gpus(self) -> List[GpuStat]:
        return selected_gpus(self.gpus, self.gpu_select)
