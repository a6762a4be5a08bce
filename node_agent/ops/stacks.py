"""Where every rank of a job on this host is: its flight recorder's last collectives and its main
thread's stack, from the rank wrapper's side thread (a dump request, node_agent/rank/rankwrap.py), and its
stack from py-spy when that is installed. A stopped rank (SIGSTOP) cannot answer: its state says so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from node_agent.host.procfs import proc_environ, read_stat
from node_agent.host.runstate import iter_states, job_pids

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


DUMP_WAIT = 3.0  # seconds the ranks' side threads get to answer (they look every 0.5 s)
STOPPED = ("T", "t")  # /proc state of a process stopped by a signal (SIGSTOP) or a tracer


def request_dumps(workers: List[Dict[str, Any]], wait: float = DUMP_WAIT) -> None:
    """Ask every rank's wrapper for its stack and flight records, and wait for the answers; each
    worker gets "fr" (its dump) or "fr_error" (why there is none)."""
    token = uuid.uuid4().hex
    rank_dirs: Dict[str, Path] = {}
    for w in workers:
        rank_dir = Path(w["state_dir"]) / "ranks"
        if rank_dir.is_dir() and str(rank_dir) not in rank_dirs:
            rank_dirs[str(rank_dir)] = rank_dir
            tmp = rank_dir / "dump.request.tmp"
            try:
                tmp.write_text(token)
                os.replace(str(tmp), str(rank_dir / "dump.request"))
            except OSError:
                pass
    deadline = time.monotonic() + wait
    waiting = [w for w in workers if str(Path(w["state_dir"]) / "ranks") in rank_dirs]
    while waiting:
        for w in list(waiting):
            answer = Path(w["state_dir"]) / "dumps" / ("%d.json" % w["local_rank"])
            try:
                data = json.loads(answer.read_text())
            except (OSError, ValueError):
                continue
            if data.get("token") == token and data.get("pid") == w["pid"]:
                w["fr"] = data
                waiting.remove(w)
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    for w in waiting:
        w["fr_error"] = "its wrapper did not answer in %.0fs" % wait
    for w in workers:
        if "fr" not in w and "fr_error" not in w:
            w["fr_error"] = "not started by ddpctl's rank wrapper"


def own_threads(frames: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The wrapper's stack of the main thread, in py-spy's shape."""
    return [{"name": "MainThread", "active": True,
             "frames": [{"name": f.get("name"), "file": f.get("file"),
                         "short_file": os.path.basename(str(f.get("file"))), "line": f.get("line")}
                        for f in frames]}]


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
                stat = read_stat(pid)
                workers.append({"job_id": job_id, "pid": pid, "rank": int(env["RANK"]),
                                "local_rank": int(env.get("LOCAL_RANK", -1)),
                                "node_rank": int(env.get("GROUP_RANK", -1)), "state_dir": state["state_dir"],
                                "process_state": stat.state if stat is not None else None})
    if not workers:
        return {"job_ids": job_ids, "ranks": [], "py_spy": None}
    if request.get("flight_records", True):
        request_dumps(workers, float(request.get("dump_wait", DUMP_WAIT)))
    py_spy = find_py_spy(request.get("python"))
    for w in workers:  # the wrapper's own stack when it answered; else py-spy's (a rank holding the GIL)
        del w["state_dir"]
        if w.get("fr", {}).get("stack"):
            w["threads"] = own_threads(w["fr"]["stack"])
        elif w["process_state"] in STOPPED:
            w["error"] = "the process is stopped (state %s: SIGSTOP, or a debugger)" % w["process_state"]
        elif py_spy is not None:
            w.update(dump_pid(py_spy, w["pid"]))
    result = {"job_ids": job_ids, "ranks": sorted(workers, key=lambda w: w["rank"]), "py_spy": py_spy}
    if py_spy is None and not all("threads" in w or "error" in w for w in workers):
        result.update(error="py-spy is not installed on this host",
                      fix="pip install py-spy (it comes with ddpctl's train extra) in the job's environment")
    return result
