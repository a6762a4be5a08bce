"""Dump the Python stack of every rank of a job on this host with py-spy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from node_agent.procfs import proc_environ
from node_agent.runstate import iter_states, job_pids

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Dict, List, Optional


def find_py_spy(python: Optional[str]) -> Optional[str]:
    """py-spy on PATH, or next to the job's interpreter (installed with the train extra)."""
    candidates = [shutil.which("py-spy")]
    for interp in (python, sys.executable):
        if interp:
            candidates.append(str(Path(interp).parent / "py-spy"))
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    return None


def dump_pid(py_spy: str, pid: int, timeout: float = 20.0) -> Dict[str, Any]:
    try:
        proc = subprocess.run([py_spy, "dump", "--pid", str(pid), "--json"], capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": "py-spy dump timed out after %.0fs" % timeout}
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip()[-500:] or "exit %d" % proc.returncode}
    try:
        threads = json.loads(proc.stdout)
    except ValueError:
        return {"error": "py-spy printed no JSON: %s" % proc.stdout[:200]}
    return {"threads": [
        {"name": t.get("thread_name"), "id": t.get("thread_id"), "active": t.get("active"),
         "owns_gil": t.get("owns_gil"),
         "frames": [{"name": f.get("name"), "file": f.get("filename"),
                     "short_file": f.get("short_filename"), "line": f.get("line")}
                    for f in t.get("frames", [])]}
        for t in threads]}


def dump(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    job = str(request["job"])
    states = list(iter_states(job))
    job_ids = sorted({s["job_id"] for s in states})
    workers: List[Dict[str, Any]] = []
    for state in states:
        job_id = state["job_id"]
        for pid in job_pids(job_id, state.get("node_rank")):
            env = proc_environ(pid)
            if "RANK" in env:
                workers.append({"job_id": job_id, "pid": pid, "rank": int(env["RANK"]),
                                "local_rank": int(env.get("LOCAL_RANK", -1)),
                                "node_rank": int(env.get("GROUP_RANK", -1))})
    if not workers:
        return {"job_ids": job_ids, "ranks": [], "py_spy": None}
    py_spy = find_py_spy(request.get("python"))
    if py_spy is None:
        return {"job_ids": job_ids, "ranks": workers, "py_spy": None,
                "error": "py-spy is not installed on this host",
                "fix": "pip install py-spy (it comes with ddpctl's train extra) in the job's environment"}
    for w in workers:
        w.update(dump_pid(py_spy, w["pid"]))
    return {"job_ids": job_ids, "ranks": sorted(workers, key=lambda w: w["rank"]), "py_spy": py_spy}
