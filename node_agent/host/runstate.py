"""Per-host run state on disk and finding/ending a job's processes by their DDPCTL_JOB_ID."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from pathlib import Path

from node_agent.host.procfs import alive, proc_environ, read_stat
from node_agent.host.terminate import terminate
from node_agent.wire.layout import RUNS, state_root

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, Dict, Iterable, Iterator, List, Optional

JOB_ENV = "DDPCTL_JOB_ID"
NODE_RANK_ENV = "DDPCTL_NODE_RANK"


def write_json_atomic(path: Path, data: Dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
    os.replace(str(tmp), str(path))


def read_json(path: Path) -> Optional[Dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def iter_states(job: Optional[str] = None) -> Iterator[Dict[str, Any]]:
    """States written by this host (matched by hostname) for all jobs, or one job id/name (or
    run id: every attempt of a restarted job). A host keeps every run it ever had (reading a
    thousand costs about 40 ms of CPU, and `top` asks every 2 s): for a named job only the runs
    whose directory starts with the name are read, since a job id starts with its job's name and
    an attempt's with its run id; every run where none does (a name that had to be made safe for
    a path)."""
    runs = state_root() / RUNS
    found = False
    if job:
        try:
            names = sorted(n for n in os.listdir(str(runs)) if n.startswith(job))
        except OSError:
            names = []
        for data in _states([p for n in names for p in sorted((runs / n).glob("node*/state.json"))], job):
            found = True
            yield data
    if not found:
        for data in _states(sorted(runs.glob("*/node*/state.json")), job):
            yield data


def _states(paths: List[Path], job: Optional[str]) -> Iterator[Dict[str, Any]]:
    me = socket.gethostname()
    for path in paths:
        data = read_json(path)
        if not data or data.get("hostname") != me:
            continue
        if job and job not in (data.get("job_id"), data.get("job_name"), data.get("run_id")):
            continue
        data["state_dir"] = str(path.parent)
        yield data


def proc_job_id(pid: int) -> Optional[str]:
    return proc_environ(pid).get(JOB_ENV)


def proc_start_ticks(pid: int) -> Optional[int]:
    stat = read_stat(pid)
    return stat.start_ticks if stat else None


class JobScan:
    """The processes of this user carrying a job's id (and this node's rank, when given: hosts that
    share a process table, like containers or namespaces, must not touch another node's processes).

    Called again, it reads only the environments of pids it has not seen: a process's environment
    is the one it started with, so its answer stands while it lives. A grace period polls this
    every POLL_S on a host of hundreds of processes; reading each one's environment on every poll
    cost a node agent about a tenth of a second of CPU per teardown. (A pid the kernel reuses
    within one scan's lifetime would keep its first answer: pids wrap after pid_max forks.)"""

    def __init__(self, job_id: str, node_rank: Optional[int] = None) -> None:
        self.job = ("\0%s=%s\0" % (JOB_ENV, job_id)).encode()
        self.rank_key = ("\0%s=" % NODE_RANK_ENV).encode()
        self.rank = None if node_rank is None else ("\0%s=%d\0" % (NODE_RANK_ENV, node_rank)).encode()
        self.me = os.getpid()
        self.uid = os.getuid()
        self.seen: Dict[str, bool] = {}  # /proc entry name -> one of the job's processes

    def __call__(self) -> List[int]:
        try:
            names = os.listdir("/proc")
        except OSError:
            return []
        found = []
        for name in names:
            member = self.seen.get(name)
            if member is None:
                if not name.isdigit():
                    continue
                member = self.seen[name] = self._member(int(name))
            if member:
                found.append(int(name))
        return sorted(found)

    def _member(self, pid: int) -> bool:
        if pid == self.me:
            return False
        try:
            if self.uid != 0 and os.stat("/proc/%d" % pid).st_uid != self.uid:
                return False
            with open("/proc/%d/environ" % pid, "rb") as f:
                env = b"\0" + f.read() + b"\0"
        except OSError:
            return False
        if self.job not in env:
            return False
        return self.rank is None or self.rank_key not in env or self.rank in env


def job_pids(job_id: str, node_rank: Optional[int] = None) -> List[int]:
    """Every process of this user carrying the job's id (see JobScan), once."""
    return JobScan(job_id, node_rank)()


def launcher_running(state: Dict[str, Any]) -> bool:
    """The node's torchrun, as its state names it, still runs (the same process: pid and start time)."""
    pid = state.get("pid")
    return isinstance(pid, int) and pid > 0 and alive(pid) and proc_start_ticks(pid) == state.get("start_ticks")


def job_is_supervised(job_id: str) -> bool:
    """A ddpctl job whose supervisor on this host still runs it: live, not stale."""
    for state in iter_states(job_id):
        pid = state.get("supervisor_pid")
        if state.get("status") == "running" and pid and alive(int(pid)):
            return True
    return False


def end_job(job_id: str, pgid: Optional[int], grace: float,
            node_rank: Optional[int] = None, failed: Iterable[int] = ()) -> Dict[str, Any]:
    """SIGTERM the job's process group and every process carrying its id; SIGKILL after grace.
    Processes are looked up by the job id again while waiting: one started meanwhile ends too.
    `failed`: processes that get SIGKILL at once, the grace period being for the ones still
    healthy: ranks whose error is recorded already, and the launcher of a job that has failed
    (see Supervisor.stop). A pid no longer carrying the job's id is left alone."""
    scan = JobScan(job_id, node_rank)
    members = scan()
    doomed = sorted(set(failed) & set(members))
    for pid in doomed:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    done = terminate(members, [pgid] if pgid else [], grace, members=scan)
    return {
        "terminated": sorted(set(done.terminated) | set(doomed)),
        "killed": sorted(set(done.killed) | set(doomed)),
        "commands": {str(p): " ".join(c)[:300] for p, c in done.commands.items()},
        "left": done.left,
    }
