"""The launch's one pre-flight round trip per host: CPUs, GPUs, interpreter, workdir, master port."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any, BinaryIO, Dict, Optional

from node_agent.runstate import alive, iter_states


def gpu_count() -> int:
    nvidia = Path("/proc/driver/nvidia/gpus")
    if nvidia.is_dir():
        return len(list(nvidia.iterdir()))
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=15,
                                 check=False).stdout
            return sum(1 for line in out.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            return 0
    return 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def port_owners(port: int) -> Optional[Dict[str, Any]]:
    try:
        from node_agent.ports import find_owners
    except ImportError:
        return None
    info = find_owners(port, "tcp")
    for owner in info.get("owners", []):
        job_id = owner.get("ddpctl_job_id")
        owner["job_live"] = bool(job_id) and job_is_supervised(job_id)
    return info


def job_is_supervised(job_id: str) -> bool:
    """A ddpctl job whose supervisor on this host still runs it: live, not stale."""
    for state in iter_states(job_id):
        pid = state.get("supervisor_pid")
        if state.get("status") == "running" and pid and alive(int(pid)):
            return True
    return False


def preflight(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    python = str(request.get("python") or "python3")
    cwd = request.get("cwd")
    result: Dict[str, Any] = {
        "hostname": socket.gethostname(),
        "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "gpu_count": gpu_count(),
        "python_found": bool(shutil.which(python) or os.access(python, os.X_OK)),
        "cwd_exists": bool(cwd) and os.path.isdir(str(cwd)),
    }
    if request.get("check_port"):
        result["port"] = port_owners(int(request["check_port"]))
    if request.get("pick_port"):
        result["free_port"] = free_port()
    return result
