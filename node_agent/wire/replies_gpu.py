"""Node agent replies (declared once: node_agent/wire/replies.py): the gpu_health op's, for `doctor --deep`."""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Optional, Tuple


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's health fields as nvidia-smi's query showed them. None: unknown (the GPU or the
    driver does not report it: `[N/A]`, `[Not Supported]`, or a field this driver refuses), never
    a fault. A GPU the driver cannot reach (fallen off the bus) has only its bus id and `error`."""

    index: Optional[int]
    uuid: Optional[str]
    name: Optional[str]
    bus_id: Optional[str]  # "00000000:3B:00.0", as nvidia-smi prints it
    ecc_uncorrected: Optional[int]  # ecc.errors.uncorrected.volatile.total (since the driver loaded)
    retired_pages_pending: Optional[bool]  # pages waiting for a reset to be retired (before Ampere)
    remap_pending: Optional[bool]  # rows waiting for a reset to be remapped (Ampere and later)
    remap_failure: Optional[bool]  # a row could not be remapped: the memory is out of spares
    throttle_mask: Optional[int]  # clocks_throttle_reasons.active (clocks_event_reasons.active)
    pcie_gen: Optional[int]
    pcie_gen_max: Optional[int]
    pcie_width: Optional[int]
    pcie_width_max: Optional[int]
    temperature_c: Optional[float]
    error: Optional[str] = None  # what nvidia-smi printed instead of the GPU or of one of its values

    @property
    def label(self) -> str:
        return "GPU %s" % self.index if self.index is not None else "GPU %s" % (self.bus_id or "?")


@dataclass(frozen=True)
class XidEvent:
    """One `NVRM: Xid (PCI:0000:3b:00): 79, ...` line of the host's kernel log."""

    pci: str  # as the driver names the GPU: "0000:3b:00" (domain:bus:device)
    xid: int
    text: str  # the rest of the line: "pid=..., GPU has fallen off the bus."
    when: Optional[str]  # the log's own time stamp, as the log printed it (None: it had none)


@dataclass(frozen=True)
class GpuHealthReport:
    """The gpu_health op's answer for one host: every GPU nvidia-smi lists (the control plane
    keeps the host's selected ones) and the last Xid lines of its kernel log."""

    hostname: str
    nvidia_smi: bool  # nvidia-smi is installed there (not: a host without GPU, not an error)
    gpus: Tuple[GpuHealth, ...]
    gpu_error: Optional[str]  # nvidia-smi failed for the whole host (NVML could not start, ...)
    unsupported: Tuple[str, ...]  # query fields this driver refused (their values are unknown)
    xids: Tuple[XidEvent, ...]  # the last ones (at most XID_KEEP), oldest first
    xid_source: Optional[str]  # the command that read the kernel log ("dmesg --ctime", ...)
    xid_error: Optional[str]  # why the kernel log could not be read (None: it was, or not tried)
    host: str = ""
