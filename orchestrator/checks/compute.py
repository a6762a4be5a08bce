"""`compute` (doctor --deep): which host or GPU multiplies matrices far slower than its peers.

Pure: the figures come from train_jobs/hostcheck/check.py (a timed matrix multiply per GPU, bf16,
or on the CPU where a host has none; throughput over a window, hosts that share a kernel timed in
turn). Each device is compared with the median of its peers: the other devices of the same model
(a GPU's name; a CPU's model and thread count). Below 1/SLOW_COMPUTE of it is a finding: a GPU
throttling (thermal, power brake), a CPU quota, or a host busy with something else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.checks.base import fail, info, ok, warn
from orchestrator.checks.model import Basis, Finding
from orchestrator.checks.spec import CheckSpec, Runs
from train_jobs.hostcheck.verdict import SLOW_COMPUTE, slow_among_peers  # below half the peers' median is slow

CHECK = "compute"
SPEC = CheckSpec(CHECK, order=170, runs=Runs.DEEP | Runs.JOB, column="cmp")
GPU_FIX = ("look at why the GPU runs slow: `nvidia-smi -q -d PERFORMANCE` (clocks event reasons: thermal, "
           "power brake, HW slowdown), `nvidia-smi -q -d TEMPERATURE,POWER`, and what else runs on it "
           "(`nvidia-smi`); this check's gpu_health findings name active throttling")
CPU_FIX = ("look at what takes the host's CPU: another job (`top`), a cgroup or container CPU quota "
           "(`cat /sys/fs/cgroup/cpu.max`), a power-saving governor (`cpupower frequency-info`)")


@dataclass(frozen=True)
class DeviceRate:
    """One device's figure."""

    host: str
    device: str  # "cpu" or "cuda:<i>" (the index among the host's selected GPUs)
    model: str  # what it is compared with: a GPU's name, or a CPU's model and threads
    tflops: float
    gpu: bool = False
    windows: int = 1  # how many timing windows its figure is the best of


def _what(rate: DeviceRate) -> str:
    """What the finding is about, after its host: the host's CPU, or one of its GPUs."""
    return f"GPU {rate.device.split(':')[1]}: compute" if rate.gpu else "compute"


def flops_text(tflops: float) -> str:
    """A figure in TFLOP/s, or GFLOP/s below 1 TFLOP/s."""
    return f"{tflops:.1f} TFLOP/s" if tflops >= 1 else f"{tflops * 1000:.1f} GFLOP/s"


def slow_devices(rates: Sequence[DeviceRate], slow: float = SLOW_COMPUTE) -> dict[DeviceRate, float]:
    """device -> its peers' median, for each device below 1/slow of it."""
    found = slow_among_peers([r.model for r in rates], [r.tflops for r in rates], slow)
    return {rates[i]: median for i, median in found.items()}


@dataclass(frozen=True)
class Late:
    """A host that missed its deadline: it did not start the host check, or not finish a window."""

    host: str
    text: str  # "did not finish its compute test in 5 s; the others took 0.3 s"
    after_s: float
    others_s: float | None
    failed: bool = False  # it could not start at all (its check ended, or never reached node 0): an error
    evidence: str = ""  # what the host printed (the tail of its output); else the deadline


def late_finding(m: Late) -> Finding:
    """A host named for a deadline it missed: a warning (late: starved or overloaded), or an error
    where it could not start at all."""
    return (fail if m.failed else warn)(CHECK, m.host, m.text, m.evidence or f"deadline {m.after_s:.1f} s",
                                        CPU_FIX + "; or the host is unreachable from the master at the job's port",
                                        basis=Basis(0, (), (), m.others_s, "s"))


def compute_findings(hosts: Sequence[str], rates: Sequence[DeviceRate], slow: float = SLOW_COMPUTE,
                     late: Sequence[Late] = ()) -> list[Finding]:
    """A warning per slow device and per host late past its deadline, else one line per host
    with its figures."""
    slow_ones = slow_devices(rates, slow)
    out: list[Finding] = []
    missed = {m.host: m for m in late}
    for host in hosts:
        if host in missed:
            out.append(late_finding(missed[host]))
            continue
        own = [r for r in rates if r.host == host]
        evidence = ", ".join(f"{r.device} {flops_text(r.tflops)} ({r.model})" for r in own)
        flagged = [r for r in own if r in slow_ones]
        for r in flagged:
            ref = slow_ones[r]
            peers = [p for p in rates if p.model == r.model and p is not r]
            out.append(warn(CHECK, host, f"{_what(r)} {ref / max(r.tflops, 1e-12):.1f}× below the median "
                            f"of its {len(peers)} peer(s) ({flops_text(r.tflops)} vs {flops_text(ref)}, {r.model}; "
                            f"best of {r.windows} window(s) each)",
                            evidence, GPU_FIX if r.gpu else CPU_FIX,
                            basis=Basis(r.windows, tuple(f"{p.host} {p.device}" for p in peers),
                                        (r.tflops,), ref, "TFLOP/s")))
        if own and not flagged:
            alone = all(sum(1 for p in rates if p.model == r.model) == 1 for r in own)
            text = ", ".join(flops_text(r.tflops) for r in own)
            out.append(info(CHECK, host, f"{text} (no peer of the same model to compare with)", evidence) if alone
                       else ok(CHECK, host, f"{len(own)} device(s): {text}", evidence))
    return out
