"""The SSH backend's links (orchestrator/launch/backends/ssh.py), their agent sessions scripted: a
message that does not decode is reported once, naming the host, the kind of message and why, and
the link reads on to the host's end, on the first session as on a re-attached one (issue 54); an
exception in a link's thread becomes a report and the host is lost through the fault model, never a
thread traceback on stderr."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from test_launch_core import A, make_job

from inventory import Host
from node_agent.wire.replies import wire
from orchestrator.launch.backends import ssh
from orchestrator.launch.events import (
    BackendEvent,
    Exited,
    Lost,
    Milestone,
    Notice,
    Output,
    Reattached,
    Reported,
    Started,
)
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import build_plan
from orchestrator.remote.agent import AgentEvent, AgentResult, Batched
from orchestrator.remote.pool import HostPool
from orchestrator.remote.wire import RankPhase, SuperviseResult
from tests.ddpctl_run import wait_for

STARTED = AgentEvent("started", {"event": "started", "log": "/state/output.log", "hostname": "a1"})
# the message: a rank's record replayed raw, without the typed wire's keys
RAW_RECORD = AgentEvent("rank", {"event": "rank", "phase": "init", "time": 1.5, "local_rank": 0, "rank": 0,
                                 "pid": 42, "host": "a1"})
STEP = AgentEvent("rank", {"event": "rank", **wire(RankPhase(0, 0, "step", 2.0, None, 5))})
BAD_SAMPLE = AgentEvent("sample", {"event": "sample", "cpu_percent": "lots", "rss_bytes": None})
RESULT = AgentResult(wire(SuperviseResult(0, steps=5)))


@dataclass
class Session:
    """An agent session (orchestrator/remote/agent.py AgentStream) playing `script`: its batches,
    then, where `fails`, that exception, or where `holds`, silence until it is aborted."""

    script: list[list[Batched]]
    code: int = 0
    fails: Exception | None = None
    holds: bool = False
    aborted: threading.Event = field(default_factory=threading.Event)
    sent: list[bytes] = field(default_factory=list)

    def batches(self) -> Iterator[list[Batched]]:
        yield from self.script
        if self.fails is not None:
            raise self.fails
        if self.holds:
            self.aborted.wait(30)

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def wait(self, timeout: float | None = None) -> int | None:
        return self.code

    def abort(self) -> None:
        self.aborted.set()


@dataclass
class Reachable:
    """The host's transport: a fresh connection always gets through."""

    host: Host

    def reconnect(self) -> None:
        return None


@dataclass
class Link:
    """One host's link run by the real backend, its sessions scripted; what it emitted, in order."""

    backend: ssh.SshBackend
    events: list[BackendEvent] = field(default_factory=list)
    ended: threading.Event = field(default_factory=threading.Event)

    def emit(self, event: BackendEvent) -> None:
        self.events.append(event)
        if isinstance(event, Exited | Lost):
            self.ended.set()

    def of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
def uncaught(monkeypatch: pytest.MonkeyPatch) -> list[threading.ExceptHookArgs]:
    """Exceptions that end a thread (Python would print their traceback on stderr)."""
    seen: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", seen.append)
    return seen


@pytest.fixture
def link(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    made: list[Link] = []

    def start(*sessions: Session) -> Link:
        queue = list(sessions)
        monkeypatch.setattr(ssh, "start_agent", lambda _transport, _op, _args: queue.pop(0))
        backend = ssh.SshBackend(HostPool())
        monkeypatch.setattr(backend.pool, "transport", Reachable)
        made.append(Link(backend))
        backend.start(build_plan(make_job((A,)), "t-1", {"a": 2}, 29555), LaunchOptions(), made[-1].emit)
        return made[-1]

    yield start
    for one in made:
        one.backend.close()


def test_an_undecodable_message_is_reported_once_and_the_link_reads_on_to_the_end(
        link: Any, uncaught: list[threading.ExceptHookArgs]) -> None:
    run = link(Session([[STARTED], [RAW_RECORD], [RAW_RECORD], [BAD_SAMPLE], [STEP],
                        [["line 1"], AgentEvent("out", {"event": "out", "end": 7})], [RESULT]]))
    assert run.ended.wait(10)
    notices = [n.text for n in run.of(Notice)]
    assert len(notices) == 2, notices  # the same fault twice: one report
    assert notices[0].startswith("a: the node agent sent a malformed rank event: RankPhase.error is missing; "
                                 "it is left out and the job goes on")
    assert '"phase": "init"' in notices[0]  # the message itself, for the bug report
    assert notices[1].startswith("a: the node agent sent a malformed sample event: HostSample.cpu_percent is 'lots'")
    assert [m.phase.phase for m in run.of(Milestone)] == ["step"]
    assert run.of(Output) == [Output("a", ["line 1"])]
    assert run.of(Reported) == [Reported("a", SuperviseResult(0, steps=5))]
    assert run.events[-1] == Exited("a", 0) and uncaught == []


def test_an_exception_in_the_thread_that_follows_a_host_loses_it_with_a_report(
        link: Any, uncaught: list[threading.ExceptHookArgs]) -> None:
    run = link(Session([[STARTED]], fails=RuntimeError("boom")))
    assert run.ended.wait(10)
    (lost,) = run.of(Lost)
    assert lost.host == "a" and lost.reason.startswith("ddpctl's run of a failed: RuntimeError('boom') at ")
    assert lost.reason.endswith("this is a ddpctl bug, please report it")
    assert run.of(Exited) == [] and uncaught == []


# (case id, the re-attached session, the events it ends with)
REATTACHED = [
    ("an-undecodable-replayed-record", Session([[AgentEvent("attached", {"event": "attached", "replay": True})],
                                                [RAW_RECORD], [STEP], [RESULT]]),
     [Reattached, Notice, Milestone, Reported, Exited]),
    ("an-exception", Session([[AgentEvent("attached", {"event": "attached"})]], fails=ValueError("bad")),
     [Reattached, Lost]),
]


@pytest.mark.parametrize(("again", "ends"), [c[1:] for c in REATTACHED], ids=[c[0] for c in REATTACHED])
def test_the_thread_that_re_attaches_survives_a_bad_message_and_reports_its_own_failure(
        link: Any, uncaught: list[threading.ExceptHookArgs], again: Session, ends: list[type[Any]]) -> None:
    first = Session([[STARTED]], holds=True)  # then silent: the core asks for a re-attach
    run = link(first, again)
    wait_for(lambda: run.of(Started), 10, "the first session's start")
    run.backend.reattach("a")
    assert run.ended.wait(10)
    assert [type(e) for e in run.events[1:]] == ends, run.events
    assert first.aborted.is_set()  # the superseded session is dropped once the new one took over
    assert uncaught == []
