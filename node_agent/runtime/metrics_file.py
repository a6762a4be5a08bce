"""A running job's Prometheus series on its host, for node_exporter's textfile collector: the
supervisor writes `<textfile_dir>/ddpctl-<job id>-node<rank>.prom` every few seconds (a temp file
renamed over it: node_exporter never reads half a file), says in it when the job has ended, and
removes it a grace later. The names, help and labels are declared once in node_agent/wire/metrics.py
(docs/metrics.md)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time

from node_agent.host.runstate import read_json
from node_agent.wire.layout import node_state_dir
from node_agent.wire.metrics import exposition
from node_agent.wire.replies_top import selected_gpus

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

    from node_agent.wire.replies_top import GpuStat

FILE_RE = re.compile(r"^ddpctl-(?P<job>.+)-node(?P<node>\d+)\.prom$")
STALE_AFTER_MIN = 60.0  # a file not rewritten this long, of a job whose supervisor is gone, is swept
MODE = 0o644  # node_exporter runs as its own user
PARTS = (("compute", "compute_ms"), ("wait", "wait_ms"), ("input", "data_ms"))  # part label, window key
MIB = 1024 * 1024


def file_name(job_id: str, node_rank: int) -> str:
    return "ddpctl-%s-node%d.prom" % (job_id, node_rank)


class JobLabels:
    """Who the series are about: the labels every series of this job on this host carries."""

    def __init__(self, hostname: str, job: str, run: str, job_id: str, node_rank: int, attempt: int) -> None:
        self.base = {"Hostname": hostname, "job_name": job, "run": run, "attempt": str(attempt)}  # type: Dict[str, str]
        self.info = dict(self.base, job_id=job_id, node_rank=str(node_rank))


def _ms(window: Any, key: str) -> Optional[float]:
    value = window.get(key) if isinstance(window, dict) else None
    return float(value) / 1000.0 if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def rank_series(labels: JobLabels, records: Mapping[str, Mapping[str, Any]],
                stragglers: Set[int]) -> List[Tuple[str, List[Tuple[Dict[str, str], float]]]]:
    """Each rank's steps, last step time, median step time and its parts, and straggler flag, from
    the rank wrapper's records ("<local rank>.<phase>" -> record)."""
    ranks = {}  # type: Dict[int, Dict[str, Any]]
    for name, record in records.items():
        number, _, phase = name.partition(".")
        if number.isdigit():
            ranks.setdefault(int(number), {})[phase] = record
    out = {name: [] for name in ("ddpctl_rank_steps", "ddpctl_rank_last_step_timestamp_seconds",
                                 "ddpctl_rank_step_median_seconds", "ddpctl_rank_step_part_seconds",
                                 "ddpctl_rank_straggler")}  # type: Dict[str, List[Tuple[Dict[str, str], float]]]
    for local in sorted(ranks):
        phases = ranks[local]
        rank = next((r.get("rank") for r in phases.values() if isinstance(r.get("rank"), int) and r["rank"] >= 0),
                    None)
        who = dict(labels.base, rank="" if rank is None else str(rank), local_rank=str(local))
        step = phases.get("step") or {}
        steps = int(step["step"]) if isinstance(step.get("step"), int) else 0
        out["ddpctl_rank_steps"].append((who, float(steps)))
        out["ddpctl_rank_straggler"].append((who, 1.0 if local in stragglers else 0.0))
        if steps and isinstance(step.get("time"), (int, float)):
            out["ddpctl_rank_last_step_timestamp_seconds"].append((who, float(step["time"])))
        window = step.get("window")
        median = _ms(window, "p50_ms")
        if median is not None:
            out["ddpctl_rank_step_median_seconds"].append((who, median))
        ddp = window.get("ddp") if isinstance(window, dict) else None
        for part, key in PARTS:
            seconds = _ms(ddp, key)
            if seconds is not None:
                out["ddpctl_rank_step_part_seconds"].append((dict(who, part=part), seconds))
    return list(out.items())


def gpu_series(labels: JobLabels, gpus: Sequence[GpuStat],
               select: Optional[Sequence[str]]) -> List[Tuple[str, List[Tuple[Dict[str, str], float]]]]:
    """The job's GPUs (its CUDA_VISIBLE_DEVICES), labelled as DCGM's exporter labels them."""
    info, util, memory = [], [], []
    for gpu in selected_gpus(gpus, select):
        if gpu.index is None:
            continue  # lost to the driver: DCGM has no index for it either
        who = dict(labels.base, gpu=str(gpu.index), UUID=gpu.uuid or "")
        info.append((dict(who, model_name=gpu.name or ""), 1.0))
        if gpu.util_pct is not None:
            util.append((who, gpu.util_pct / 100.0))
        if gpu.memory_used_mib is not None:
            memory.append((who, gpu.memory_used_mib * MIB))
    return [("ddpctl_gpu_info", info), ("ddpctl_gpu_utilization_ratio", util),
            ("ddpctl_gpu_memory_used_bytes", memory)]


def job_series(labels: JobLabels, started: float, records: Mapping[str, Mapping[str, Any]], stragglers: Set[int],
               gpus: Sequence[GpuStat] = (), select: Optional[Sequence[str]] = None, ended: Optional[float] = None,
               exit_code: Optional[int] = None) -> List[Tuple[str, List[Tuple[Dict[str, str], float]]]]:
    """The job, its ranks and its GPUs; once `ended`, the end time and exit code (and no GPUs)."""
    base = labels.base
    series = [("ddpctl_job_info", [(labels.info, 1.0)]),
              ("ddpctl_job_running", [(base, 0.0 if ended is not None else 1.0)]),
              ("ddpctl_job_start_timestamp_seconds", [(base, started)])]
    if ended is not None:
        series.append(("ddpctl_job_end_timestamp_seconds", [(base, ended)]))
        if exit_code is not None:
            series.append(("ddpctl_job_exit_code", [(base, float(exit_code))]))
    return series + rank_series(labels, records, stragglers) + \
        ([] if ended is not None else gpu_series(labels, gpus, select))


def job_text(labels: JobLabels, started: float, records: Mapping[str, Mapping[str, Any]], stragglers: Set[int],
             gpus: Sequence[GpuStat] = (), select: Optional[Sequence[str]] = None,
             ended: Optional[float] = None, exit_code: Optional[int] = None) -> str:
    """The whole file (job_series in Prometheus' text format)."""
    return exposition(job_series(labels, started, records, stragglers, gpus, select, ended, exit_code))


class MetricsFile:
    """One job's file on this host. A directory that cannot be written costs the series, never the
    job: the first error is kept (`broken`) and the file goes quiet."""

    def __init__(self, directory: str, job_id: str, node_rank: int) -> None:
        self.directory = os.path.expanduser(directory)
        self.path = os.path.join(self.directory, file_name(job_id, node_rank))
        self.tmp = os.path.join(self.directory, ".%s.tmp" % file_name(job_id, node_rank))
        self.broken: Optional[str] = None
        self.written: Optional[int] = None  # the last write's mtime (ns): the removal checks it

    def write(self, text: str) -> bool:
        if self.broken is not None:
            return False
        try:
            with open(self.tmp, "w") as out:
                out.write(text)
            os.chmod(self.tmp, MODE)
            os.replace(self.tmp, self.path)
            self.written = os.stat(self.path).st_mtime_ns
        except OSError as exc:
            self.broken = "%s: %s" % (self.path, exc.strerror or exc)
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
            return False
        return True

    def remove_later(self, after: float) -> None:
        """Remove the file `after` seconds from now, unless it has been written again since (a
        detached process of its own: the supervisor ends now)."""
        if self.written is None:
            return
        if after <= 0:
            _remove_if_unchanged(self.path, self.written)
            return
        with contextlib.suppress(OSError):
            subprocess.Popen([sys.executable, "-S", "-c", REMOVER, self.path, str(self.written), str(after)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True, close_fds=True)


def _remove_if_unchanged(path: str, mtime_ns: int) -> None:
    with contextlib.suppress(OSError):
        if os.stat(path).st_mtime_ns == mtime_ns:
            os.unlink(path)


# The detached remover: standard library only, no import of the agent (its files may be gone by then).
REMOVER = """import os, sys, time
path, mtime, after = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
time.sleep(after)
try:
    if os.stat(path).st_mtime_ns == mtime:
        os.unlink(path)
except OSError:
    pass
"""


def sweep(directory: str, keep: float, hostname: str, now: Optional[float] = None) -> List[str]:
    """Remove ddpctl's files left in `directory` by jobs of this host that are over: not rewritten
    for max(keep, STALE_AFTER_MIN) seconds, and their supervisor is not running (a supervisor
    killed outright, a remover that a scheduler ended). Another host's file (a shared directory) is
    left alone. Returns the paths removed."""
    now = time.time() if now is None else now
    removed: List[str] = []
    try:
        names = os.listdir(os.path.expanduser(directory))
    except OSError:
        return removed
    for name in names:
        match = FILE_RE.match(name)
        if match is None:
            continue
        path = os.path.join(os.path.expanduser(directory), name)
        try:
            if now - os.stat(path).st_mtime < max(keep, STALE_AFTER_MIN):
                continue
        except OSError:
            continue
        state = read_json(node_state_dir(match.group("job"), int(match.group("node"))) / "state.json")
        if state is not None and (state.get("hostname") not in (None, hostname) or _running(state)):
            continue
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(path)
    return removed


def _running(state: Dict[str, Any]) -> bool:
    pid = state.get("supervisor_pid")
    if state.get("status") != "running" or not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: alive
    return True
