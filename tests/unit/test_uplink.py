"""The node side of the fault model on this machine: a supervisor whose stdout blocks forever still
ends its job when the control plane goes quiet; a re-attached session resumes the output at the
last committed batch (none lost, none twice), also after the job ended; the rank files are read
as whole lines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from inventory import LOCALHOST
from node_agent.host.runstate import alive
from node_agent.runtime import ranklogs, uplink
from orchestrator.remote.agent import AgentEvent, AgentResult, AgentStream, agent_argv, request_bytes, start_agent
from orchestrator.remote.transport import LocalTransport

# A stand-in for torchrun: records its pid, then prints numbered lines (--count, every --every s;
# 1 KB lines when flooding), then exits 0.
FAKE_TORCHRUN = """
import os, sys, time
count, every, width = int(os.environ["COUNT"]), float(os.environ["EVERY"]), int(os.environ.get("WIDTH", "0"))
with open(os.environ["PIDFILE"] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(os.environ["PIDFILE"] + ".tmp", os.environ["PIDFILE"])
pad = "x" * width
i = 0
while count < 0 or i < count:
    print("line %d %s" % (i, pad), flush=True)
    i += 1
    if every:
        time.sleep(every)
"""


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., dict[str, Any]]]:
    state_root = tmp_path / "state"
    monkeypatch.setenv("DDPCTL_STATE_ROOT", str(state_root))  # the agents inherit os.environ
    script = tmp_path / "fake_torchrun.py"
    script.write_text(FAKE_TORCHRUN)
    pidfiles: list[Path] = []

    def request(job_id: str, count: int, every: float, heartbeat_timeout: float = 30, width: int = 0) -> dict[str, Any]:
        pidfile = tmp_path / f"{job_id}.pid"
        pidfiles.append(pidfile)
        return {"job_id": job_id, "job_name": "fake", "node_rank": 0, "launcher": [sys.executable, str(script)],
                "program": ["train.py"], "cwd": str(tmp_path), "grace": 2.0, "heartbeat_timeout": heartbeat_timeout,
                "detach": False, "env": {"PIDFILE": str(pidfile), "COUNT": str(count), "EVERY": str(every),
                                         "WIDTH": str(width)},
                "_state": state_root / "runs" / job_id / "node0", "_pidfile": pidfile}

    yield request
    for pidfile in pidfiles:
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)
    return value


def start(request: dict[str, Any], op: str = "supervise") -> AgentStream:
    args = {k: v for k, v in request.items() if not k.startswith("_")}
    return start_agent(LocalTransport(LOCALHOST), op, args)


def committed(stream: AgentStream, stop_after: int | None = None) -> tuple[list[str], int, dict[str, Any] | None]:
    """The lines a control plane would hand on (those a commit line covers), the offset after the
    last commit, and the result; `stop_after`: stop reading after that many committed lines."""
    lines: list[str] = []
    pending: list[str] = []
    offset, result = 0, None
    for batch in stream.batches():
        for message in batch:
            if isinstance(message, list):
                pending.extend(message)
            elif isinstance(message, str):
                pending.append(message)
            elif isinstance(message, AgentEvent) and message.name == "out":
                lines += pending
                pending, offset = [], int(message["end"])
            elif isinstance(message, AgentResult):
                result = dict(message.data)
        if stop_after is not None and len(lines) >= stop_after:
            break
    return lines, offset, result


def test_a_stdout_that_blocks_forever_does_not_stop_the_watchdog(job: Callable[..., dict[str, Any]]) -> None:
    """Nobody reads the agent's stdout (a dead channel): the ranks flood it, the pipe fills, and
    the supervisor still ends its job when no heartbeat comes."""
    request = job("blocked-1", -1, 0.0, heartbeat_timeout=2, width=1000)
    args = {k: v for k, v in request.items() if not k.startswith("_")}
    agent = subprocess.Popen(agent_argv(sys.executable), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             start_new_session=True)
    try:
        assert agent.stdin is not None
        agent.stdin.write(request_bytes("supervise", args))
        agent.stdin.flush()
        pid = int(wait_until(lambda: request["_pidfile"].exists() and request["_pidfile"].read_text(), 30,
                             "the fake torchrun to start"))
        log = request["_state"] / "output.log"
        wait_until(lambda: log.exists() and log.stat().st_size > 1 << 20, 30, "a flood well past the pipe's buffer")
        wait_until(lambda: not alive(pid), 15, "the watchdog to end the flooding job")
        state = wait_until(lambda: json.loads((request["_state"] / "state.json").read_text())
                           if "exited" in (request["_state"] / "state.json").read_text() else None,
                           15, "the final state")
        assert state["stop_reason"] == "no heartbeat from the control plane for 2s"
        assert log.stat().st_size > 1 << 20  # the whole flood is in the node's log
    finally:
        agent.kill()
        agent.wait(10)


def test_a_reattached_session_resumes_at_the_last_commit_none_lost_none_twice(
        job: Callable[..., dict[str, Any]]) -> None:
    request = job("reattach-1", 400, 0.005)
    first = start(request)
    seen, offset, _ = committed(first, stop_after=50)
    assert offset > 0 and 50 <= len(seen) < 400
    second = start({"job_id": "reattach-1", "node_rank": 0, "offset": offset}, op="attach")
    rest, _, result = committed(second)
    assert second.wait(30) == 0 and result is not None and result["exit_code"] == 0
    assert [line.split()[1] for line in seen + rest] == [str(i) for i in range(400)]
    first.abort()  # the old session closing now is no news to the supervisor: it ended well
    assert json.loads((request["_state"] / "state.json").read_text())["stop_reason"] is None


def test_attaching_after_the_job_ended_replays_the_rest_and_the_recorded_result(
        job: Callable[..., dict[str, Any]]) -> None:
    request = job("replay-1", 30, 0.0)
    first = start(request)
    seen, offset, result = committed(first)
    assert result is not None and len(seen) == 30
    late = start({"job_id": "replay-1", "node_rank": 0, "offset": 0}, op="attach")
    again, end, replayed = committed(late)
    assert late.wait(30) == 0
    assert again == seen and end == offset
    assert replayed is not None and replayed["exit_code"] == 0 and replayed["log"] == result["log"]


@pytest.mark.parametrize(("writes", "final", "expected"), [
    ([b"a\nb\n"], False, b"[default1]:a\n[default1]:b\n"),
    ([b"a\nhal", b"f\n"], False, b"[default1]:a\n[default1]:half\n"),  # a line read half-written waits
    ([b"no newline yet"], False, b""),
    ([b"no newline at the end"], True, b"[default1]:no newline at the end\n"),
    ([b"x\n\ny\n"], False, b"[default1]:x\n[default1]:\n[default1]:y\n"),
])
def test_rank_files_are_passed_on_as_whole_prefixed_lines(tmp_path: Path, writes: list[bytes], final: bool,
                                                          expected: bytes) -> None:
    rank_file = tmp_path / "logs" / "job_x" / "attempt_0" / "1" / "stdout.log"
    rank_file.parent.mkdir(parents=True)
    out: list[bytes] = []
    logs = ranklogs.RankLogs(str(tmp_path / "logs"), out.append)
    with rank_file.open("wb", buffering=0) as f:
        for data in writes:
            f.write(data)
            logs.poll(final=True) if final else logs.poll()
            logs.last_scan = 0.0
    logs.close()
    assert b"".join(out) == expected


def test_a_line_left_unfinished_goes_as_it_is_after_a_while(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranklogs, "PARTIAL_S", 0.0)  # a progress bar that never ends its line
    rank_file = tmp_path / "job_x" / "attempt_0" / "0" / "stderr.log"
    rank_file.parent.mkdir(parents=True)
    rank_file.write_bytes(b"50%\r")
    out: list[bytes] = []
    logs = ranklogs.RankLogs(str(tmp_path), out.append)
    logs.poll()
    logs.close()
    assert out == [b"[default0]:50%\r\n"]


@pytest.mark.parametrize(("data", "start", "lines", "after"), [
    (b"a\nb\n", 10, b"a\nb\n", 14),
    (b"a\nb\nhalf of c", 0, b"a\nb\n", 4),  # the batch ended inside a line: it comes whole next time
    (b"x" * 8, 100, b"x" * 8 + b"\n", 108),  # a line longer than a batch goes in pieces
])
def test_a_batch_is_its_whole_lines_then_their_commit(data: bytes, start: int, lines: bytes, after: int) -> None:
    payload, end = uplink.batch_of(data, start)
    assert end == after
    assert payload == lines + uplink.event_line("out", end=after)
