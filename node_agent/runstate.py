"""Per-host run state on disk and finding/ending a job's processes by their DDPCTL_JOB_ID."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

JOB_ENV = "DDPCTL_JOB_ID"
NODE_RANK_ENV = "DDPCTL_NODE_RANK"


def state_root() -> Path:
    return Path(os.environ.get("DDPCTL_STATE_ROOT") or Path.home() / ".ddpctl")


def state_dir(job_id: str, node_rank: int) -> Path:
    """runs/<job id>/node<rank>: keyed by node rank, because homes are often shared (NFS)."""
    return state_root() / "runs" / job_id / ("node%d" % node_rank)


def write_json_atomic(path: Path, data: Dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
    os.replace(str(tmp), str(path))


def read_json(path: Path) -> Optional[Dict[str, Any]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def iter_states(job: Optional[str] = None) -> Iterator[Dict[str, Any]]:
    """States written by this host (matched by hostname) for all jobs, or one job id/name."""
    me = socket.gethostname()
    for path in sorted((state_root() / "runs").glob("*/node*/state.json")):
        data = read_json(path)
        if not data or data.get("hostname") != me:
            continue
        if job and job not in (data.get("job_id"), data.get("job_name")):
            continue
        data["state_dir"] = str(path.parent)
        yield data


def proc_environ(pid: int) -> Dict[str, str]:
    """A process's environment from /proc (empty when it is gone or not ours to read)."""
    try:
        raw = Path("/proc/%d/environ" % pid).read_bytes()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def proc_env_var(pid: int, name: str) -> Optional[str]:
    return proc_environ(pid).get(name)


def proc_job_id(pid: int) -> Optional[str]:
    return proc_env_var(pid, JOB_ENV)


def proc_start_ticks(pid: int) -> Optional[int]:
    try:
        stat = Path("/proc/%d/stat" % pid).read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def proc_cmdline(pid: int) -> List[str]:
    try:
        raw = Path("/proc/%d/cmdline" % pid).read_bytes()
    except OSError:
        return []
    return [p.decode("utf-8", "replace") for p in raw.split(b"\0") if p]


def job_pids(job_id: str, node_rank: Optional[int] = None) -> List[int]:
    """Every process of this user carrying the job's id (and this node's rank, when given:
    hosts that share a process table, like containers or namespaces, must not touch another
    node's processes)."""
    me = os.getpid()
    uid = os.getuid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if entry.stat().st_uid != uid and uid != 0:
                continue
        except OSError:
            continue
        pid = int(entry.name)
        if proc_job_id(pid) != job_id:
            continue
        if node_rank is not None and proc_env_var(pid, NODE_RANK_ENV) not in (None, str(node_rank)):
            continue
        found.append(pid)
    return sorted(found)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path("/proc/%d/stat" % pid)
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _signal_all(pgid: Optional[int], pids: List[int], sig: int) -> None:
    if pgid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def end_job(job_id: str, pgid: Optional[int], grace: float,
            node_rank: Optional[int] = None) -> Dict[str, Any]:
    """SIGTERM the job's process group and every process carrying its id; SIGKILL after grace."""
    pids = job_pids(job_id, node_rank)
    targets = {pid: proc_cmdline(pid) for pid in pids}
    _signal_all(pgid, pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not [p for p in job_pids(job_id, node_rank) if alive(p)]:
            break
        time.sleep(0.1)
    survivors = [p for p in job_pids(job_id, node_rank) if alive(p)]
    if survivors:
        _signal_all(pgid, survivors, signal.SIGKILL)
        for p in survivors:
            targets.setdefault(p, proc_cmdline(p))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and [p for p in job_pids(job_id, node_rank) if alive(p)]:
            time.sleep(0.05)
    return {
        "terminated": sorted(targets),
        "killed": sorted(survivors),
        "commands": {str(p): " ".join(c)[:300] for p, c in targets.items()},
        "left": [p for p in job_pids(job_id, node_rank) if alive(p)],
    }
