"""The node side of a Slurm job, on this machine: the supervisor started as a batch task (its
request from a file, its node rank from SLURM_PROCID, the early-warning signal passed on to
torchrun), and the `follow` op that streams the job's growing output files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from inventory import LOCALHOST
from node_agent.wire.protocol import parse_line
from orchestrator.remote.agent import BOOTSTRAP, AgentEvent, AgentResult, agent_payload, start_agent
from orchestrator.remote.transport import LocalTransport

# Stands in for torchrun: prints its argv and env, then waits for SIGUSR1 (as torchrun started
# with --signals-to-handle ...,SIGUSR1 would pass it to the ranks) and exits 0 when it comes.
FAKE_TORCHRUN = """
import os, signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
print("node_rank=%s secret=%s" % (os.environ["DDPCTL_NODE_RANK"], os.environ["API_TOKEN"]), flush=True)
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:
    time.sleep(0.05)
print("got SIGUSR1" if got else "no signal", flush=True)
sys.exit(0 if got else 3)
"""


def wait_until(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_batch_task_supervises_its_node_and_passes_the_early_signal_on(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(BOOTSTRAP)
    request = {"op": "supervise", "job_id": "batch-test", "launcher": [sys.executable, "-c", FAKE_TORCHRUN],
               "program": [], "env": {"API_TOKEN": "s3cret"}, "cwd": str(tmp_path), "grace": 2,
               "batch": True, "node_rank_env": "SLURM_PROCID", "heartbeat_timeout": 0,
               "forward_signals": ["USR1"]}
    (tmp_path / "node.in").write_bytes(agent_payload() + json.dumps(request).encode() + b"\n")
    out = tmp_path / "node1.out"
    env = {**os.environ, "SLURM_PROCID": "1", "DDPCTL_STATE_ROOT": str(tmp_path / "state")}
    with (tmp_path / "node.in").open("rb") as stdin, out.open("wb") as stdout:
        proc = subprocess.Popen([sys.executable, str(tmp_path / "agent.py")], stdin=stdin, stdout=stdout,
                                stderr=subprocess.STDOUT, env=env)
    try:
        wait_until(lambda: "node_rank=1" in out.read_text(), 30, "the node's torchrun to start")
        proc.send_signal(signal.SIGUSR1)  # what srun passes on from the batch shell's trap
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = out.read_text().splitlines()
    events = [parse_line(line) for line in lines]
    started = next(e for e in events if e and e["event"] == "started")
    assert started["state_dir"].endswith("/runs/batch-test/node1")  # its rank from SLURM_PROCID
    result = next(e for e in events if e and e["event"] == "result")["result"]
    assert result["exit_code"] == 0 and result["stop_reason"] is None
    assert "node_rank=1 secret=s3cret" in lines and "got SIGUSR1" in lines


def test_follow_streams_new_files_and_whole_lines_until_stopped(tmp_path: Path) -> None:
    stream = start_agent(LocalTransport(LOCALHOST), "follow",
                         {"dir": str(tmp_path), "pattern": r"^.*\.out$", "poll": 0.05})
    seen: list[tuple[str, str]] = []
    (tmp_path / "a.out").write_text("one\ntw")
    (tmp_path / "requeue-0").write_text("")
    messages = stream.messages()

    def take_until(predicate: object) -> None:
        for message in messages:
            if isinstance(message, AgentEvent) and message.name in ("file", "line"):
                seen.append((message.name, str(message.get("name")) + ":" + str(message.get("text", ""))))
            if predicate():  # type: ignore[operator]
                return
        raise AssertionError(f"the stream ended; saw {seen}")

    take_until(lambda: ("line", "a.out:one") in seen)
    with (tmp_path / "a.out").open("a") as f:
        f.write("o\nthree\n")
    (tmp_path / "b.out").write_text("bee\n")
    take_until(lambda: ("line", "b.out:bee") in seen and ("line", "a.out:three") in seen)
    with (tmp_path / "a.out").open("a") as f:
        f.write("last\n")
    stream.send(b"STOP\n")  # a last pass after STOP: nothing written before it is lost
    results = []
    for message in messages:
        if isinstance(message, AgentResult):
            results.append(message)
        elif isinstance(message, AgentEvent) and message.name == "line":
            seen.append(("line", f"{message.get('name')}:{message.get('text')}"))
    assert ("line", "a.out:last") in seen
    assert [t for k, t in seen if k == "line" and t.startswith("a.out")][:3] == ["a.out:one", "a.out:two",
                                                                                 "a.out:three"]
    assert ("file", "requeue-0:") in seen  # every new file is reported, even ones not followed
    assert not any(t.startswith("requeue-0:") for k, t in seen if k == "line")
    assert results and results[0]["files"] == ["a.out", "b.out", "requeue-0"]
    assert stream.wait(10) == 0
