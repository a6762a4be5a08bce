"""Ops over this host's ddpctl jobs: list them (ps), stop them (down), replay their output (logs)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from node_agent.factparse import parse_nvidia_apps
from node_agent.procfs import alive
from node_agent.protocol import write_line
from node_agent.runstate import end_job, iter_states, job_pids, proc_start_ticks

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Dict, Optional


def _running(state: Dict[str, Any]) -> bool:
    pid = state.get("pid")
    return bool(pid) and alive(int(pid)) and proc_start_ticks(int(pid)) == state.get("start_ticks")


def _gpu_memory_by_pid() -> Dict[int, int]:
    """pid -> GPU MiB, from the same nvidia-smi query and parser the doctor's facts use."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    usage: Dict[int, int] = {}
    for app in parse_nvidia_apps(out):
        usage[app["pid"]] = usage.get(app["pid"], 0) + int(app["used_memory_mib"] or 0)
    return usage


def ps(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    gpu = _gpu_memory_by_pid()
    jobs = []
    for state in iter_states(request.get("job")):
        if not _running(state):
            continue
        pids = job_pids(state["job_id"], state.get("node_rank"))
        jobs.append({
            "job_id": state["job_id"], "job_name": state.get("job_name"),
            "node_rank": state.get("node_rank"), "pid": state.get("pid"), "pids": pids,
            "uptime_s": round(time.time() - float(state.get("started_at", time.time())), 1),
            "detached": state.get("detached", False), "log": state.get("log"),
            "gpu_memory_mib": sum(gpu.get(p, 0) for p in pids) if gpu else None,
        })
    return {"jobs": jobs}


def down(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """Stop every running instance of a job (by id or name) on this host."""
    grace = float(request.get("grace", 10.0))
    stopped = []
    for state in iter_states(request["job"]):
        job_id, node_rank = state["job_id"], state.get("node_rank")
        pgid = int(state["pgid"]) if _running(state) else None
        if pgid is None and not job_pids(job_id, node_rank):
            continue
        outcome = end_job(job_id, pgid, grace, node_rank)
        outcome["job_id"] = job_id
        stopped.append(outcome)
    return {"stopped": stopped, "exit_code": 0}


def _latest_state(job: str) -> Optional[Dict[str, Any]]:
    states = list(iter_states(job))
    return max(states, key=lambda s: float(s.get("started_at", 0))) if states else None


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with open(str(path), "rb") as f:
            f.seek(offset)
            return f.read()
    except OSError:
        return b""


def logs(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """Print a job's saved output on this host; with follow, keep printing until the job ends."""
    state = _latest_state(request["job"])
    if state is None:
        return {"found": False, "exit_code": 1}
    path = Path(state["log"])
    follow = bool(request.get("follow"))
    offset = 0
    while True:
        last = not follow or not _running(state)
        chunk = _read_from(path, offset)
        if not last:
            chunk = chunk[: chunk.rfind(b"\n") + 1]  # only whole lines while it still writes
        offset += len(chunk)
        for line in chunk.splitlines():
            write_line(line.decode("utf-8", "replace"))
        if last:
            break
        time.sleep(0.2)
    return {"found": True, "job_id": state["job_id"], "node_rank": state.get("node_rank"),
            "log": str(path), "running": _running(state), "exit_code": 0}
