"""What `ddpctl top` samples on a host: its GPUs (nvidia-smi's CSV query), the CPU time and memory
of a set of processes (psutil when importable, else /proc), and an interface's byte counters
(/proc/net/dev). Two samples `interval` seconds apart give CPU % and the tx/rx rates.

nvidia-smi rather than NVML through ctypes: it is what every GPU host has, its CSV query is one
short process (about 50 ms of CPU), and its failures ("Failed to initialize NVML", a GPU lost
after an Xid 79) are printed in words that go straight to the user. Standard library only
(psutil when present), Python 3.8 and newer.
"""

from __future__ import annotations

import os
import subprocess
from collections import namedtuple

from node_agent.host.command import run_command
from node_agent.host.factparse import GPU_STATS_QUERY, parse_nvidia_gpu_stats, parse_proc_net_dev
from node_agent.host.procfs import read_stat
from node_agent.host.sitedirs import add_site_packages
from node_agent.wire.replies_top import GpuStat

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

    from node_agent.host.command import Runner

NVIDIA_SMI_TIMEOUT_S = 5.0
GPU_ARGV = ["nvidia-smi", "--query-gpu=" + GPU_STATS_QUERY, "--format=csv,noheader,nounits"]


# nvidia-smi's answer on this host: its GPUs (GpuStat), the host's error (None), and whether
# nvidia-smi is installed here (not: a CPU host, no GPUs and no error).
GpuSample = namedtuple("GpuSample", ("gpus", "error", "nvidia_smi"))


def gpu_stat(row: Dict[str, Any]) -> GpuStat:
    """One GPU of factparse.parse_nvidia_gpu_stats as the replies declare it."""
    return GpuStat(index=row.get("index"), uuid=row.get("uuid"), name=row.get("name"), util_pct=row.get("util_pct"),
                   memory_used_mib=row.get("memory_used_mib"), memory_total_mib=row.get("memory_total_mib"),
                   power_w=row.get("power_w"), error=row.get("error"), bus_id=row.get("bus_id"))


def gpu_sample(run: Optional[Runner] = None) -> GpuSample:
    """The GPUs nvidia-smi's query shows. No nvidia-smi: no GPUs and no error (a CPU host)."""
    try:
        code, out = (run or run_command)(list(GPU_ARGV), NVIDIA_SMI_TIMEOUT_S)
    except FileNotFoundError:
        return GpuSample((), None, False)
    except subprocess.TimeoutExpired:
        return GpuSample((), "nvidia-smi did not answer in %.0f s" % NVIDIA_SMI_TIMEOUT_S, True)
    except OSError as exc:
        return GpuSample((), "nvidia-smi could not run: %s" % exc, True)
    parsed = parse_nvidia_gpu_stats(out, code)
    return GpuSample(tuple(gpu_stat(g) for g in parsed["gpus"]), parsed["error"], True)


def gpu_select(env: Dict[str, str]) -> Optional[Tuple[str, ...]]:
    """The GPUs a job's CUDA_VISIBLE_DEVICES names (indices or UUIDs); None: it names none, all."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    return tuple(v.strip() for v in visible.split(",") if v.strip())


def _psutil() -> Any:
    """The psutil module where this host's interpreter has it, else None."""
    add_site_packages()  # the agent starts without them (python -S)
    try:
        import psutil
    except ImportError:
        return None
    return psutil


class ProcReader(object):
    """CPU seconds (user + system) and RSS bytes of processes: psutil when importable (`use_psutil`
    None), else /proc."""

    def __init__(self, use_psutil: Optional[bool] = None) -> None:
        self.psutil = _psutil() if use_psutil in (None, True) else None
        if use_psutil and self.psutil is None:
            raise ImportError("psutil is not importable here")
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.page = os.sysconf("SC_PAGE_SIZE")

    @property
    def source(self) -> str:
        return "psutil" if self.psutil is not None else "/proc"

    def one(self, pid: int) -> Optional[Tuple[float, int]]:
        """(CPU seconds, RSS bytes) of a live process; None when it is gone or a zombie."""
        if self.psutil is not None:
            try:
                proc = self.psutil.Process(pid)
                with proc.oneshot():
                    if proc.status() == self.psutil.STATUS_ZOMBIE:
                        return None
                    times = proc.cpu_times()
                    return times.user + times.system, int(proc.memory_info().rss)
            except (self.psutil.Error, OSError):
                return None
        stat = read_stat(pid)
        if stat is None or stat.state == "Z":
            return None
        return stat.cpu_ticks / float(self.ticks), stat.rss_pages * self.page

    def sample(self, pids: Iterable[int]) -> Dict[int, Tuple[float, int]]:
        """pid -> (CPU seconds, RSS bytes) for each live process of `pids`."""
        out = {}
        for pid in pids:
            got = self.one(pid)
            if got is not None:
                out[pid] = got
        return out


def cpu_and_rss(before: Dict[int, Tuple[float, int]], after: Dict[int, Tuple[float, int]],
                seconds: float) -> Tuple[Optional[float], int]:
    """(CPU % over the interval, RSS bytes now) of a set of processes from two samples. A process
    that started in between counts with all its CPU time; one that ended, with none of its last
    interval. CPU % is of one core (400 %: four cores busy); None without an interval."""
    used = 0.0
    for pid, (cpu, _rss) in after.items():
        used += max(0.0, cpu - before[pid][0]) if pid in before else cpu
    rss = sum(rss for _cpu, rss in after.values())
    return (round(100.0 * used / seconds, 1) if seconds > 0 else None), rss


def nic_counters(path: str = "/proc/net/dev") -> Dict[str, Tuple[int, int]]:
    """interface -> (rx bytes, tx bytes), as the kernel counts them in this network namespace."""
    try:
        with open(path) as f:
            return parse_proc_net_dev(f.read())
    except OSError:
        return {}


def nic_rates(names: Sequence[str], before: Dict[str, Tuple[int, int]], after: Dict[str, Tuple[int, int]],
              seconds: float) -> Tuple[Optional[float], Optional[float]]:
    """(tx, rx) bytes per second summed over the interfaces `names`; None where none of them has
    both samples (or there was no interval). A counter that went back (the interface was re-made)
    counts as 0."""
    both = [n for n in names if n in before and n in after]
    if not both or seconds <= 0:
        return None, None
    rx = sum(max(0, after[n][0] - before[n][0]) for n in both)
    tx = sum(max(0, after[n][1] - before[n][1]) for n in both)
    return round(tx / seconds, 1), round(rx / seconds, 1)
