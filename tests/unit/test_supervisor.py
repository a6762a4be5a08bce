"""The node agent's supervise op on this machine: state file, stdin EOF / STOP / heartbeat end the job."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from inventory import LOCALHOST
from node_agent.host.runstate import alive
from orchestrator.remote.agent import AgentResult, AgentStream, start_agent
from orchestrator.remote.transport import LocalTransport, OutputLine

# A stand-in for torchrun: ignores its argv, starts a grandchild in a NEW session (so the process
# group kill alone cannot reach it), records both pids, then runs until told otherwise.
FAKE_TORCHRUN = """
import json, os, subprocess, sys, time
print("ARGV " + json.dumps(sys.argv[1:]), flush=True)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
with open(os.environ["PIDFILE"] + ".tmp", "w") as f:
    f.write("%d %d" % (os.getpid(), child.pid))
os.replace(os.environ["PIDFILE"] + ".tmp", os.environ["PIDFILE"])
print("ready", flush=True)
if os.environ.get("EXIT_CODE"):
    child.kill()
    sys.exit(int(os.environ["EXIT_CODE"]))
time.sleep(300)
"""


@dataclass
class Supervised:
    running: AgentStream
    pidfile: Path
    state_root: Path
    job_id: str

    def pids(self, timeout: float = 30) -> list[int]:
        wait_until(self.pidfile.exists, timeout, "the fake torchrun to record its pids")
        return [int(p) for p in self.pidfile.read_text().split()]

    def state(self) -> dict[str, Any]:
        return json.loads((self.state_root / "runs" / self.job_id / "node0" / "state.json").read_text())

    def finish(self, timeout: float = 30) -> tuple[int, dict[str, Any], list[str]]:
        """Exit code of the agent, its result and the program's output lines."""
        code = self.running.wait(timeout)
        assert code is not None, f"supervise op still running after {timeout}s"
        result: dict[str, Any] = {}
        output = []
        for message in self.running.messages():
            if isinstance(message, OutputLine):
                output.append(message.text)
            elif isinstance(message, AgentResult):
                result = dict(message.data)
        return code, result, output


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def supervise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Supervised]]:
    state_root = tmp_path / "state"
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(state_root))  # LocalTransport passes os.environ on
    script = tmp_path / "fake_torchrun.py"
    script.write_text(FAKE_TORCHRUN)
    started: list[Supervised] = []

    def start(job_id: str, heartbeat_timeout: float = 0, env: dict[str, str] | None = None) -> Supervised:
        pidfile = tmp_path / f"{job_id}.pids"
        request = {"job_id": job_id, "job_name": "fake", "node_rank": 0,
                   "launcher": [sys.executable, str(script)], "program": ["train.py", "--x", "a b"],
                   "env": {"PIDFILE": str(pidfile), **(env or {})}, "cwd": str(tmp_path), "grace": 2.0,
                   "heartbeat_timeout": heartbeat_timeout, "detach": False}
        sup = Supervised(start_agent(LocalTransport(LOCALHOST), "supervise", request), pidfile,
                         state_root, job_id)
        started.append(sup)
        return sup

    yield start
    for sup in started:
        sup.running.close_stdin()
        sup.running.wait(10)
        if sup.pidfile.exists():
            for pid in (int(p) for p in sup.pidfile.read_text().split()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def gone(pids: list[int]) -> Callable[[], bool]:
    return lambda: not any(alive(p) for p in pids)


def test_state_file_and_argv_with_log_dir(supervise: Callable[..., Supervised]) -> None:
    sup = supervise("sup-state-1")
    torchrun_pid, _child = sup.pids()
    state = sup.state()
    assert state["status"] == "running" and state["pid"] == torchrun_pid and state["job_id"] == "sup-state-1"
    log_dir = str(sup.state_root / "runs" / "sup-state-1" / "node0" / "torchrun")
    assert state["argv"][-5:] == ["--log-dir", log_dir, "train.py", "--x", "a b"]
    sup.running.close_stdin()
    _code, result, output = sup.finish()
    assert json.loads(next(o for o in output if o.startswith("ARGV "))[5:]) == \
        ["--log-dir", log_dir, "train.py", "--x", "a b"]
    assert result["stop_reason"] == "control connection lost (stdin closed)"
    assert sup.state()["status"] == "exited"


@pytest.mark.parametrize("how", ["close_stdin", "abort", "STOP", "ABORT"])
def test_losing_or_stopping_the_control_plane_ends_torchrun_and_its_detached_child(
        supervise: Callable[..., Supervised], how: str) -> None:
    sup = supervise(f"sup-{how.lower()}-1")
    pids = sup.pids()
    assert all(alive(p) for p in pids)
    if how == "close_stdin":
        sup.running.close_stdin()
    elif how == "abort":
        sup.running.abort()
    else:
        sup.running.send(how.encode() + b"\n")
    code, result, _output = sup.finish()
    wait_until(gone(pids), 15, "torchrun and its setsid child to end")
    expected = {"STOP": "stopped by the control plane", "ABORT": "stopped by the control plane: the job failed"}
    assert expected.get(how, "control connection lost") in result["stop_reason"]
    assert sup.state()["status"] == "exited"
    if how == "ABORT":  # torchrun got SIGKILL, not a grace; the job failed, as torchrun would say
        assert code == 1 and result["exit_code"] == 1


def test_no_heartbeat_stops_the_job(supervise: Callable[..., Supervised]) -> None:
    sup = supervise("sup-heartbeat-1", heartbeat_timeout=1.0)
    pids = sup.pids()
    _code, result, _output = sup.finish(timeout=30)  # stdin stays open: only the watchdog can stop it
    assert result["stop_reason"].startswith("no heartbeat from the control plane")
    wait_until(gone(pids), 15, "the job to end after the heartbeat timeout")


def test_program_exit_code_is_the_agent_exit_code(supervise: Callable[..., Supervised]) -> None:
    sup = supervise("sup-exit-1", env={"EXIT_CODE": "3"})
    code, result, output = sup.finish()
    assert code == 3 and result["exit_code"] == 3 and result["stop_reason"] is None
    assert "ready" in output
    assert sup.state()["status"] == "exited" and sup.state()["exit_code"] == 3


# A stand-in for torchrun whose ranks start in sessions of their own, as torchrun's do: rank 1
# records its error as the rank wrapper does and then takes its time to exit; rank 0 is healthy and
# notes the SIGTERM that gives it its grace period.
FAILING_RANKS = """
import json, os, signal, subprocess, sys, time
RANK = '''
import json, os, signal, sys, time
me = sys.argv[1]
signal.signal(signal.SIGTERM, lambda s, f: (open(os.environ["MARKS"] + "/term." + me, "w").close(), sys.exit(0)))
if me == "1":
    time.sleep(0.5)
    path = os.path.join(os.environ["DDPCTL_RANK_DIR"], "1.error")
    with open(path + ".tmp", "w") as f:
        json.dump({"phase": "error", "local_rank": 1, "rank": 1, "pid": os.getpid(), "time": time.time(),
                   "type": "RuntimeError", "message": "boom", "traceback": ""}, f)
    os.replace(path + ".tmp", path)
open(os.environ["MARKS"] + "/up." + me, "w").close()
time.sleep(300)
'''
signal.signal(signal.SIGTERM, lambda s, f: open(os.environ["MARKS"] + "/term.torchrun", "w").close())
ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(r)], start_new_session=True) for r in (0, 1)]
with open(os.environ["PIDFILE"] + ".tmp", "w") as f:
    f.write(" ".join(str(pid) for pid in [os.getpid(), *(p.pid for p in ranks)]))
os.replace(os.environ["PIDFILE"] + ".tmp", os.environ["PIDFILE"])
print("ready", flush=True)
for p in ranks:
    p.wait()
time.sleep(300)
"""


def test_a_failed_rank_ends_the_job_on_its_host_without_the_control_plane(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor reads the rank's error record itself: the failed rank is SIGKILLed at once
    (no grace: its handler never runs), and so is torchrun (its SIGTERM handler would only pass the
    signal on); the healthy rank gets SIGTERM, and all of it with stdin still open and no STOP
    from the control plane."""
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(tmp_path / "state"))
    script, pidfile, marks = tmp_path / "fake_torchrun.py", tmp_path / "pids", tmp_path / "marks"
    script.write_text(FAILING_RANKS)
    marks.mkdir()
    request = {"job_id": "sup-rank-fails-1", "job_name": "fake", "node_rank": 0,
               "launcher": [sys.executable, str(script)], "program": ["train.py"],
               "env": {"PIDFILE": str(pidfile), "MARKS": str(marks)}, "cwd": str(tmp_path), "grace": 30.0,
               "heartbeat_timeout": 0, "detach": False, "wrap": True}
    running = start_agent(LocalTransport(LOCALHOST), "supervise", request)
    sup = Supervised(running, pidfile, tmp_path / "state", "sup-rank-fails-1")
    try:
        pids = sup.pids()
        code, result, _output = sup.finish(timeout=25)  # well inside the 30 s grace and rank 1's sleep
        wait_until(gone(pids), 15, "torchrun and both ranks to end")
        assert result["stop_reason"] == "rank 1 failed (RuntimeError)"
        assert code == 1 and result["exit_code"] == 1 and result["first_error"]["message"] == "boom"
        assert (marks / "term.0").exists(), "the healthy rank got no SIGTERM"
        assert not (marks / "term.1").exists(), "the failed rank was given a grace period"
        assert not (marks / "term.torchrun").exists(), "torchrun was given a grace period"
    finally:
        running.close_stdin()
        running.wait(10)
        if pidfile.exists():
            for pid in (int(p) for p in pidfile.read_text().split()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
