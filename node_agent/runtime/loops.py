"""The restart loop of a detached job with restarts: `ddpctl up` itself, run as a daemon on the
job's first host, so that the job is restarted when the machine that launched it is gone.

    loops/<run id>.json   its pid, hostname, argv, log and when it started (written by the daemon
                          itself before it execs `ddpctl up`)
    loops/<run id>.log    everything that `up` prints

`ddpctl down <run id or job name>` ends a loop first (SIGTERM: `up` stops the job on every host as
Ctrl-C does, and restarts nothing), then the job's supervisors. Standard library only."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from node_agent.host.procfs import alive
from node_agent.host.runstate import read_json, write_json_atomic
from node_agent.wire.layout import state_root

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is for the checker only (node_agent/__init__.py)
    from typing import Any, BinaryIO, Dict, Iterator, List

STARTED_WITHIN_S = 10.0  # the daemon writes its record before it execs, well within this
STOP_WAIT_S = 60.0  # `up` stops its job on every host (their grace included) within this, or is killed


def loops_dir() -> Path:
    return state_root() / "loops"


def start(request: Dict[str, Any], control: BinaryIO) -> Dict[str, Any]:
    """Double-fork `request["argv"]` in `request["cwd"]` as a daemon that outlives this session;
    return its record once it has written it."""
    run_id = str(request["run_id"])
    where = loops_dir()
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    record, log = where / ("%s.json" % run_id), where / ("%s.log" % run_id)
    if record.exists():
        return {"error": "a restart loop for run %s was started here already" % run_id, "exit_code": 1}
    argv = [str(a) for a in request["argv"]]
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        try:
            os.chdir(str(request.get("cwd") or Path.home()))
            out = os.open(str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            write_json_atomic(record, {"run_id": run_id, "job_name": request.get("job_name"), "pid": os.getpid(),
                                       "hostname": socket.gethostname(), "argv": argv, "log": str(log),
                                       "cwd": os.getcwd(), "started_at": time.time()})
            os.execvp(argv[0], argv)
        except BaseException as exc:  # exec failed: the log says why
            os.write(2, ("ddpctl: could not start %s: %r\n" % (argv[0], exc)).encode())
        os._exit(127)
    os.waitpid(child, 0)  # the first child exits at once; its child runs on, adopted by init
    deadline = time.monotonic() + STARTED_WITHIN_S
    while time.monotonic() < deadline:
        data = read_json(record)
        if data is not None:
            return dict(data, exit_code=0)
        time.sleep(0.02)
    return {"error": "the restart loop did not start within %.0fs (see %s)" % (STARTED_WITHIN_S, log), "exit_code": 1}


def iter_loops(job: str) -> Iterator[Dict[str, Any]]:
    """This host's loops of a run (by run id) or a job (by name), running or not."""
    me = socket.gethostname()
    for path in sorted(loops_dir().glob("*.json")):
        data = read_json(path)
        if data and data.get("hostname") == me and job in (data.get("run_id"), data.get("job_name")):
            yield data


def is_loop(data: Dict[str, Any]) -> bool:
    """The pid is still that loop (pids wrap): its command line holds the run id."""
    pid = int(data.get("pid") or 0)
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return alive(pid) and str(data.get("run_id")).encode() in f.read()
    except OSError:
        return False


def stop(job: str) -> List[Dict[str, Any]]:
    """SIGTERM every running loop of `job` here and wait for it to end (SIGKILL after STOP_WAIT_S)."""
    stopped = []
    for data in iter_loops(job):
        if not is_loop(data):
            continue
        pid = int(data["pid"])
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while is_loop(data) and time.monotonic() < deadline:
            time.sleep(0.1)
        how = "SIGTERM"
        if is_loop(data):
            os.kill(pid, signal.SIGKILL)
            how = "SIGKILL"
        stopped.append({"job_id": "restart loop of %s" % data.get("run_id"), "terminated": [pid],
                        "killed": [pid] if how == "SIGKILL" else [], "left": [],
                        "commands": {str(pid): "ddpctl up (the restart loop; log %s)" % data.get("log")}})
    return stopped
