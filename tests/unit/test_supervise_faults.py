"""The fault model applied by the supervision, through the backend seam: a scripted backend goes
quiet, comes back, dies or floods, and the supervision re-attaches, loses, blames and stops as
orchestrator/launch/faults.py says; control events overtake output (launch/lanes.py); SIGTERM and
SIGHUP end `up` as Ctrl-C does. Limits are shortened to fractions of a second."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from rich.console import Console
from test_launch_core import A, B, C, emit_all, make_job, phase

from inventory import Job
from orchestrator.account.compute import account
from orchestrator.account.events import path_of
from orchestrator.account.events import read as read_events
from orchestrator.checks.model import ProbeResults
from orchestrator.commands import up
from orchestrator.hostops.stacks import StacksReport
from orchestrator.launch import core, faults, supervise
from orchestrator.launch.backends.base import DetachReport, Emit, Notice, Resolved
from orchestrator.launch.events import (
    Alive,
    BackendEvent,
    Ended,
    Exited,
    Lost,
    Milestone,
    Output,
    Reattached,
    Reported,
    Started,
)
from orchestrator.launch.faults import FaultLimits
from orchestrator.launch.labels import RankLines
from orchestrator.launch.lanes import Lanes
from orchestrator.launch.observer import Collected
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.outcome import EXIT_STOPPED
from orchestrator.launch.plan import LaunchPlan, build_plan
from orchestrator.launch.result import HostLoss, HostRun, RankFailure, RunResult, RunState
from orchestrator.remote.wire import RankError, RankPhase, SuperviseResult
from orchestrator.sync.core import Progress, SyncReport
from orchestrator.watch.factory import standard_monitors

SILENT_AFTER = 0.4
CLOCK = re.compile(r"\d\d:\d\d:\d\d")


@pytest.fixture(autouse=True)
def fast_limits(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """Fault limits in fractions of a second; call the fixture's value to change lost_after."""
    monkeypatch.setattr(supervise, "CHECK_EVERY", 0.05)

    def use(lost_after: float = 1.5) -> None:
        limits = FaultLimits(lost_after=lost_after, silent_after=SILENT_AFTER, retry_every=0.1)
        monkeypatch.setattr(supervise, "limits_for", lambda _job, _flag: limits)

    use()
    return use


@dataclass
class FaultyBackend:
    """Runs `script` in a thread when started (test_launch_core's ScriptedBackend, plus re-attach);
    records what the supervision asked of it; should the script fail, it ends every host (so a
    broken script fails its test instead of hanging it)."""

    script: Callable[[FaultyBackend, Emit], None]
    name: str = "scripted"
    stops: list[tuple[tuple[str, ...], bool]] = field(default_factory=list)
    failed_stops: list[bool] = field(default_factory=list)  # each stop's `failed`
    dropped: list[str] = field(default_factory=list)
    reattached: list[str] = field(default_factory=list)
    journal: list[str] = field(default_factory=list)  # stop requests, among what the observer saw
    stopped: threading.Event = field(default_factory=threading.Event)
    script_errors: list[BaseException] = field(default_factory=list)

    def sync(self, job: Job, options: LaunchOptions, progress: Progress) -> SyncReport | None:
        return None

    def resolve(self, job: Job, options: LaunchOptions, notice: Notice, settle: bool) -> Resolved:
        return Resolved({h.name: 2 for h in job.hosts}, 29555)

    def start(self, plan: LaunchPlan, options: LaunchOptions, emit: Emit) -> None:
        def run() -> None:
            try:
                self.script(self, emit)
            except BaseException as exc:  # reported by the test, never swallowed
                self.script_errors.append(exc)
                emit_all(emit, [Exited(hl.host.name, 99) for hl in plan.hosts])

        threading.Thread(target=run, daemon=True).start()

    def stop(self, hosts: Sequence[str], force: bool, failed: bool = False) -> None:
        self.journal.append("stop")
        self.stops.append((tuple(hosts), force))
        self.failed_stops.append(failed)
        self.stopped.set()

    def drop(self, host: str) -> None:
        self.dropped.append(host)

    def reattach(self, host: str) -> None:
        self.reattached.append(host)

    def close(self) -> None:
        return None

    def detach(self, plan: LaunchPlan, options: LaunchOptions) -> DetachReport:
        return DetachReport()

    def stacks(self, plan: LaunchPlan) -> StacksReport:
        return StacksReport(plan.job_id)

    def reprobe(self, plan: LaunchPlan) -> ProbeResults:
        return ProbeResults()


Script = Callable[[FaultyBackend, Emit], None]


def run_job(script: Script, tmp_path: Path, job: Job | None = None, observer: Collected | None = None,
            ) -> tuple[RunResult, Collected, FaultyBackend]:
    backend = FaultyBackend(script)
    out = observer or Collected()
    result = core.launch(job or make_job(), backend, out, LaunchOptions(grace=1.0, runs_dir=tmp_path),
                         monitors=standard_monitors)  # as `up` runs it
    assert not backend.script_errors, backend.script_errors
    return result, out, backend


def keep_alive(emit: Emit, hosts: Sequence[str], until: Callable[[], bool] = lambda: False,
               for_s: float = 10.0) -> bool:
    """Heartbeats from `hosts` every 50 ms until `until()` holds (True) or `for_s` passed (False)."""
    deadline = time.monotonic() + for_s
    while time.monotonic() < deadline:
        if until():
            return True
        emit_all(emit, [Alive(h) for h in hosts])
        time.sleep(0.05)
    return until()


def summary(result: RunResult) -> dict[str, object]:
    data: dict[str, object] = json.loads((result.run_dir / "summary.json").read_text())
    return data


def states(result: RunResult) -> dict[str, RunState]:
    return {r.host: r.state for r in result.hosts}


def rank_error(message: str, kind: str = "RuntimeError", rank: int = 0, at: float | None = None) -> RankError:
    return RankError(0, message, f"Traceback ...\n{kind}: {message}", time.time() if at is None else at, None,
                     rank=rank, kind=kind)


# -- silent, re-attached, lost ---------------------------------------------------------------------

@pytest.mark.parametrize(("back", "notice"), [
    (Reattached("b"), r"^b back after \d+s: re-attached on a fresh connection"),
    (Alive("b"), r"^b back after \d+s$"),
], ids=["on-a-fresh-connection", "heard-again-on-the-old-one"])
def test_a_host_that_goes_quiet_is_reattached_once_and_the_job_runs_on(
        tmp_path: Path, back: Reattached | Alive, notice: str) -> None:
    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b")])
        assert keep_alive(emit, ["a"], until=lambda: "b" in b.reattached), "b never judged silent"
        keep_alive(emit, ["a"], for_s=0.3)  # still silent, short of lost_after: no second attempt
        emit(back)
        keep_alive(emit, ["a", "b"], for_s=0.3)
        emit_all(emit, [Exited("a", 0), Exited("b", 0)])

    result, out, backend = run_job(script, tmp_path)
    assert backend.reattached == ["b"]
    quiet = [n for n in out.notices if n.startswith("lost contact with")]
    assert len(quiet) == 1 and re.match(r"lost contact with b at \d\d:\d\d:\d\d \(", quiet[0])
    assert "the job runs on" in quiet[0]
    assert len([n for n in out.notices if re.search(notice, n)]) == 1, out.notices
    assert result.exit_code == 0 and result.first_failure is None and result.loss is None
    assert backend.dropped == [] and backend.stops == []
    assert summary(result)["lost"] is None


def test_a_host_silent_for_lost_after_is_lost_dropped_and_the_job_stops(tmp_path: Path) -> None:
    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b")])
        assert keep_alive(emit, ["a"], until=b.stopped.is_set), "b was never lost"
        emit(Exited("a", 143))

    started = time.monotonic()
    result, _out, backend = run_job(script, tmp_path)
    assert time.monotonic() - started >= 1.5  # not before lost_after
    assert backend.reattached == ["b"]  # silent first: one fresh connection tried
    assert backend.dropped == ["b"] and backend.stops == [(("a",), False)]
    assert backend.failed_stops == [True], "a lost host fails the job: torchrun gets no grace"
    assert result.loss is not None and result.loss.host == "b"
    assert result.loss.reason.startswith("no contact with b for 2s (since ")  # lost_after 1.5, as "%.0f"
    assert "host down or network cut" in result.loss.reason
    assert result.first_failure is not None and result.first_failure.host == "b"
    assert result.exit_code == 1
    assert states(result) == {"a": RunState.STOPPED, "b": RunState.LOST}
    data = summary(result)
    assert data["lost"] == {"host": "b", "reason": result.loss.reason, "at": result.loss.at}
    assert data["first_failure"] == "b"
    assert isinstance(data["hosts"], list) and [h["state"] for h in data["hosts"]] == ["stopped", "lost"]


def test_a_connection_closed_without_an_exit_status_is_a_loss_at_once_never_exit_minus_one(
        tmp_path: Path, fast_limits: Callable[[float], None]) -> None:
    fast_limits(30.0)

    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"), Exited("b", None)])
        assert b.stopped.wait(5), "the job was not stopped at once"
        emit(Exited("a", 143))

    result, out, backend = run_job(script, tmp_path)
    reason = "connection to b lost: host or sshd died (it closed without an exit status)"
    assert result.loss is not None and (result.loss.host, result.loss.reason) == ("b", reason)
    assert backend.dropped == ["b"] and backend.reattached == []
    b_run = next(r for r in result.hosts if r.host == "b")
    assert (b_run.state, b_run.exit_code, b_run.error) == (RunState.LOST, None, reason)
    assert result.first_failure is b_run and result.exit_code == 1
    everything = " ".join([*out.notices, json.dumps(summary(result))])
    assert "exit -1" not in everything and "exit code -1" not in everything and '"exit_code": -1' not in everything


# (case id, silent hosts, the surviving rank's error message, hosts lost at once)
BLAME = [
    ("the-silent-host-it-names", ("b",), "Connection closed by peer [198.18.0.2]:1234", ("b",)),
    ("the-only-silent-host", ("b",), "Connection reset by peer", ("b",)),
    ("of-two-silent-the-one-it-names", ("b", "c"), "Connection closed by peer [198.18.0.3]:1234", ("c",)),
    ("of-two-silent-none-when-it-names-neither", ("b", "c"), "Connection reset by peer", ()),
]


@pytest.mark.parametrize(("silent", "message", "lost"), [c[1:] for c in BLAME], ids=[c[0] for c in BLAME])
def test_a_peer_error_on_a_live_host_loses_a_silent_host_at_once(
        tmp_path: Path, fast_limits: Callable[[float], None], silent: tuple[str, ...], message: str,
        lost: tuple[str, ...]) -> None:
    fast_limits(30.0)  # far longer than the test: any loss here is the blame's
    live = [h for h in "abc" if h not in silent]
    echo = rank_error(message)

    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started(h) for h in "abc"])
        assert keep_alive(emit, live, until=lambda: set(b.reattached) == set(silent)), b.reattached
        emit(phase("a", 0, 0, "error", echo.timestamp or 0.0, echo))
        assert b.stopped.wait(5)
        emit_all(emit, [Exited("a", 1), Exited("b", 143), Exited("c", 143)])

    result, _out, backend = run_job(script, tmp_path, make_job(hosts=(A, B, C)))
    assert tuple(backend.dropped) == lost  # by the blame: lost_after (30 s) never came
    assert result.root_cause is not None and result.root_cause.host == "a" and result.root_cause.consequence
    assert result.exit_code == 1
    if lost:
        assert result.loss is not None and result.loss.host == lost[0]
        assert "the ranks on a lost their connections to it" in result.loss.reason
        assert result.first_failure is not None and result.first_failure.host == lost[0]  # the loss outranks
        assert states(result)[lost[0]] is RunState.LOST
    else:
        assert result.loss is None
        assert result.first_failure is not None and result.first_failure.host == "a"


def test_a_ranks_own_error_that_came_first_stays_the_cause_when_a_host_is_lost_later(tmp_path: Path) -> None:
    crash = rank_error("boom", kind="ValueError", rank=1, at=time.time() - 1.0)  # the loss comes later

    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"), phase("a", 1, 1, "error", crash.timestamp or 0.0, crash)])
        assert b.stopped.wait(5)
        emit_all(emit, [Exited("b", None), Exited("a", 1)])

    result, _out, backend = run_job(script, tmp_path)
    assert backend.dropped == ["b"] and states(result)["b"] is RunState.LOST  # lost, but not the cause
    assert result.loss is None and summary(result)["lost"] is None
    assert result.root_cause is not None and (result.root_cause.host, result.root_cause.error) == ("a", crash)
    assert result.first_failure is not None and result.first_failure.host == "a"
    assert result.exit_code == 1


def test_a_node_that_stopped_its_job_for_lack_of_us_is_a_loss(tmp_path: Path) -> None:
    gave_up = SuperviseResult(143, "no heartbeat from the control plane for 90s", None, None, None, None)

    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"), Reported("b", gave_up), Exited("b", 143)])
        assert b.stopped.wait(5)
        emit(Exited("a", 143))

    result, _out, _backend = run_job(script, tmp_path)
    assert result.loss is not None and result.loss.host == "b"
    assert result.loss.reason == "b stopped its job on its own: no heartbeat from the control plane for 90s"
    assert result.first_failure is not None and result.first_failure.host == "b"
    assert result.exit_code == 1


# (case id, what stops the job first, then: b's connection closes without an exit status)
LOST_AFTER_THE_STOP = [
    ("after-a-failed", lambda emit: emit(Exited("a", 1)), "a"),
    ("after-sigterm", lambda _emit: os.kill(os.getpid(), signal.SIGTERM), None),
]


@pytest.mark.parametrize(("stop_first", "first_failure"), [c[1:] for c in LOST_AFTER_THE_STOP],
                         ids=[c[0] for c in LOST_AFTER_THE_STOP])
def test_a_host_lost_while_the_job_stops_is_not_the_cause(
        tmp_path: Path, stop_first: Callable[[Emit], None], first_failure: str | None) -> None:
    observer = RunningObserver(2)

    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b")])
        assert observer.running.wait(5)
        stop_first(emit)
        assert b.stopped.wait(5)
        emit_all(emit, [Exited("a", 143), Exited("b", None)])

    result, _out, _backend = run_job(script, tmp_path, observer=observer)
    assert states(result)["b"] is RunState.LOST  # lost all the same
    assert result.loss is None
    assert (result.first_failure.host if result.first_failure else None) == first_failure


def test_a_host_that_died_is_the_cause_though_a_peers_lost_connection_was_reported_first(tmp_path: Path) -> None:
    """A host killed outright: its peer's "connection closed" may arrive before its own closed
    connection does. The peer's error stopped the job, but it was a consequence: the dead host is
    still named."""
    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"),
                        phase("a", 0, 0, "error", error=rank_error("Connection closed by peer [198.18.0.11]:4242"))])
        assert b.stopped.wait(5)
        emit_all(emit, [Exited("b", None), Exited("a", 1)])

    result, _out, _backend = run_job(script, tmp_path)
    assert result.loss is not None and result.loss.host == "b"
    assert result.first_failure is not None and result.first_failure.host == "b"
    assert "connection to b lost: host or sshd died" in result.loss.reason


# (case id, events after both started (then: stopped, then the rest), expected states)
STOPPED_HOSTS = [
    ("a-rank-error", [phase("a", 0, 0, "error", 1.0, rank_error("boom", "ValueError", at=1.0))],
     [Exited("a", 1), Exited("b", 143)], {"a": RunState.FAILED, "b": RunState.STOPPED}),
    ("a-non-zero-exit", [Exited("a", 1)], [Exited("b", 143)], {"a": RunState.FAILED, "b": RunState.STOPPED}),
    ("the-other-exits-cleanly-anyway", [Exited("a", 1)], [Exited("b", 0)],
     {"a": RunState.FAILED, "b": RunState.EXITED}),
    ("a-lost-host", [Lost("b", "connection refused")], [Exited("a", 143)],
     {"a": RunState.STOPPED, "b": RunState.LOST}),
]


@pytest.mark.parametrize(("first", "then", "expected"), [c[1:] for c in STOPPED_HOSTS],
                         ids=[c[0] for c in STOPPED_HOSTS])
def test_hosts_ended_by_our_stop_are_stopped_and_only_the_cause_failed(
        tmp_path: Path, first: list[BackendEvent], then: list[BackendEvent], expected: dict[str, RunState]) -> None:
    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"), *first])
        assert b.stopped.wait(5)
        emit_all(emit, then)

    result, _out, _backend = run_job(script, tmp_path)
    assert states(result) == expected
    hosts = summary(result)["hosts"]
    assert isinstance(hosts, list) and [h["state"] for h in hosts] == [s.value for s in expected.values()]
    assert result.exit_code == 1


@pytest.mark.parametrize(("heard_s", "silent"), [(0.1, False), (1.0, True)],
                         ids=["heard-us-lately", "has-not-heard-us-for-silent_after"])
def test_a_node_that_has_not_heard_us_is_silent_though_its_heartbeats_arrive(
        tmp_path: Path, heard_s: float, silent: bool) -> None:
    def script(_b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b")])
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:
            emit_all(emit, [Alive("a"), Alive("b", heard_s=heard_s)])
            time.sleep(0.05)
        emit_all(emit, [Exited("a", 0), Exited("b", 0)])

    result, out, backend = run_job(script, tmp_path)
    assert backend.reattached == (["b"] if silent else [])
    assert any(n.startswith("lost contact with b at ") for n in out.notices) is silent
    assert result.exit_code == 0 and result.loss is None  # silent, but never for lost_after


class SlowObserver(Collected):
    """Takes `per_batch` seconds over each output batch; notes each batch in `journal`."""

    def __init__(self, journal: list[str], per_batch: float) -> None:
        super().__init__()
        self.journal = journal
        self.per_batch = per_batch

    def on_lines(self, host: str, lines: RankLines) -> None:
        time.sleep(self.per_batch)
        self.journal.append(f"lines {host}")
        super().on_lines(host, lines)


def supervise_directly(backend: FaultyBackend, tmp_path: Path, observer: Collected,
                       lanes: Lanes | None = None) -> RunResult:
    plan = build_plan(make_job(), "t-1", {"a": 2, "b": 2}, 29555)
    options = LaunchOptions(grace=1.0, runs_dir=tmp_path)
    sup = supervise.Supervision(plan, backend, observer, tmp_path / plan.job_id, options,
                                standard_monitors(plan, options))
    if lanes is not None:
        sup.lanes = lanes
    result = sup.run()
    assert not backend.script_errors, backend.script_errors
    return result


def test_every_output_line_reaches_the_observer_and_the_log_in_order(tmp_path: Path) -> None:
    batches = {h: [[f"{h}{i}-{j}" for j in range(50)] for i in range(40)] for h in "ab"}

    def script(_b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b")])
        for i in range(40):
            emit_all(emit, [Output("a", batches["a"][i]), Output("b", batches["b"][i])])
        emit_all(emit, [Exited("a", 0), Exited("b", 0)])

    result, out, _backend = run_job(script, tmp_path)
    assert result.exit_code == 0
    for host in "ab":
        every = [line for batch in batches[host] for line in batch]
        assert [text for h, rank, text in out.lines if h == host] == every
        assert all(rank is None for h, rank, _ in out.lines)
        assert (result.run_dir / f"{host}.log").read_text() == "\n".join(every) + "\n"
        assert next(r for r in result.hosts if r.host == host).tail == every[-30:]


def test_a_rank_error_behind_200_output_batches_stops_the_job_before_they_are_shown(tmp_path: Path) -> None:
    error = rank_error("boom", "ValueError")

    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b")])
        emit_all(emit, [Output("b", [f"line {i}"]) for i in range(200)])
        emit(phase("a", 0, 0, "error", error.timestamp or 0.0, error))
        assert b.stopped.wait(10)
        emit_all(emit, [Exited("a", 1), Exited("b", 143)])

    backend = FaultyBackend(script)
    journal = backend.journal
    out = SlowObserver(journal, 0.001)
    result = supervise_directly(backend, tmp_path, out, Lanes(max_output=256))
    assert journal.count("lines b") == 200 and journal.count("stop") == 1
    shown_before_stop = journal.index("stop")
    assert shown_before_stop < 150, f"the error waited behind {shown_before_stop} output batches"
    assert [text for _h, _r, text in out.lines] == [f"line {i}" for i in range(200)]  # none lost, in order
    assert result.first_failure is not None and result.first_failure.host == "a"


def test_a_host_whose_output_waits_for_room_in_the_lane_is_not_silent(
        tmp_path: Path, fast_limits: Callable[[float], None]) -> None:
    """Our own backlog holds its reader up for longer than silent_after: that is us being slow."""
    fast_limits(30.0)

    out = SlowObserver([], 1.5 * SILENT_AFTER)

    def script(_b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"), Exited("a", 0)])
        for i in range(4):  # a reader: a heartbeat follows each batch it could hand over
            emit_all(emit, [Output("b", [f"line {i}"]), Alive("b")])
        assert keep_alive(emit, ["b"], until=lambda: len(out.lines) == 4)
        emit(Exited("b", 0))

    backend = FaultyBackend(script)
    result = supervise_directly(backend, tmp_path, out, Lanes(max_output=1))
    assert backend.reattached == [] and not any("lost contact" in n for n in out.notices)
    assert [text for _h, _r, text in out.lines] == [f"line {i}" for i in range(4)]
    assert result.exit_code == 0


# -- the lanes -------------------------------------------------------------------------------------

def test_lanes_hand_out_control_events_before_output_each_in_order() -> None:
    lanes = Lanes()
    queued: list[BackendEvent] = [Output("a", ["1"]), Alive("a"), Output("b", ["2"]), Exited("b", 0),
                                  Output("a", ["3"])]
    for event in queued:
        lanes.put(event)
    taken = [lanes.get(0.1) for _ in queued]
    assert taken == [Alive("a"), Exited("b", 0), Output("a", ["1"]), Output("b", ["2"]), Output("a", ["3"])]
    assert lanes.empty() and lanes.get(0.01) is None


def test_a_full_output_lane_holds_the_producer_until_a_batch_is_taken_but_never_a_control_event() -> None:
    lanes = Lanes(max_output=2)
    lanes.put(Output("a", ["1"]))
    lanes.put(Output("a", ["2"]))
    output_in, control_in = threading.Event(), threading.Event()

    def put(event: Output | Exited, done: threading.Event) -> None:
        lanes.put(event)
        done.set()

    threading.Thread(target=put, args=(Output("a", ["3"]), output_in), daemon=True).start()
    threading.Thread(target=put, args=(Exited("a", 0), control_in), daemon=True).start()
    assert control_in.wait(2), "a control event waited for room in the output lane"
    assert not output_in.wait(0.2), "an output batch went past a full lane"
    assert lanes.get(0.1) == Exited("a", 0)
    assert not output_in.wait(0.1), "taking a control event made room for output"
    assert lanes.get(0.1) == Output("a", ["1"])
    assert output_in.wait(2), "taking a batch did not let the waiting producer in"
    assert [lanes.get(0.1), lanes.get(0.1)] == [Output("a", ["2"]), Output("a", ["3"])]


def test_get_waits_for_an_event_put_from_another_thread() -> None:
    lanes = Lanes()
    timer = threading.Timer(0.1, lanes.put, args=(Exited("a", 0),))
    timer.start()
    assert lanes.get(5) == Exited("a", 0)
    timer.join()


# -- SIGTERM and SIGHUP ----------------------------------------------------------------------------

class RunningObserver(Collected):
    """Signals once every host has been seen running (the supervision loop is under way)."""

    def __init__(self, hosts: int) -> None:
        super().__init__()
        self.hosts = hosts
        self.running = threading.Event()

    def on_state(self, run: HostRun) -> None:
        super().on_state(run)
        if sum(state == "running" for _h, state in self.states) >= self.hosts:
            self.running.set()


@pytest.mark.parametrize(("signum", "words"), [(signal.SIGTERM, "got SIGTERM"), (signal.SIGHUP, "got SIGHUP")],
                         ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_stops_the_job_as_ctrl_c_does_and_up_exits_128_plus_it(
        tmp_path: Path, signum: signal.Signals, words: str) -> None:
    assert threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signum)
    observer = RunningObserver(2)

    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b")])
        assert observer.running.wait(5)
        os.kill(os.getpid(), signum)
        assert b.stopped.wait(5)
        emit_all(emit, [Exited("a", 128 + signum), Exited("b", 128 + signum)])

    result, out, backend = run_job(script, tmp_path, observer=observer)
    assert result.exit_code == 128 + signum and result.signal == signum and result.interrupted
    assert backend.stops == [(("a", "b"), False)]  # gracefully, as a first Ctrl-C
    assert backend.failed_stops == [False], "a signal is the user's stop, not a failure"
    notice = next(n for n in out.notices if words in n)
    assert f"`up` exits {128 + signum}" in notice
    assert states(result) == {"a": RunState.STOPPED, "b": RunState.STOPPED}
    assert summary(result)["signal"] == signum
    assert re.fullmatch(rf"stopped by {signum.name} to `up` \(at \d\d:\d\d:\d\d\)", str(summary(result)["stopped_by"]))
    assert signal.getsignal(signum) is before


# (case id, what b does once the job runs: its link stays silent while it is re-attached to; it is
# re-attached again and again but never reports (issue 54: the thread that re-attached died on each
# replay); it keeps its link alive but never confirms (its stop word was never delivered))
UNCONFIRMED = ["silent-while-re-attaching", "re-attached-again-and-again-never-reporting",
               "connected-but-the-stop-word-lost"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
@pytest.mark.parametrize("case", UNCONFIRMED)
def test_a_stop_signal_ends_up_within_the_stop_bound_whatever_a_hosts_link_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast_limits: Callable[[float], None], case: str,
        signum: signal.Signals) -> None:
    """The job stops on every host and `up` ends --grace + STOP_MARGIN after the signal, though b
    never confirms: b is lost then (its node ends its part on its own), the headline and exit code
    are the signal's. lost_after is long: only the stop's bound can end it."""
    fast_limits(30.0)
    monkeypatch.setattr(faults, "STOP_MARGIN", 0.5)  # with run_job's --grace 1: a bound of 1.5 s
    observer = RunningObserver(2)
    signalled: list[float] = []
    over = threading.Event()

    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b")])
        assert observer.running.wait(5)
        if case != "connected-but-the-stop-word-lost":
            assert keep_alive(emit, ["a"], until=lambda: "b" in b.reattached), "b never judged silent"
        signalled.append(time.monotonic())
        os.kill(os.getpid(), signum)
        assert b.stopped.wait(5)
        emit(Exited("a", 128 + signum))
        answered, give_up = 0, time.monotonic() + 8.0
        while not over.wait(0.05):  # b as the case has it, until `up` has ended
            if time.monotonic() > give_up:  # `up` did not end: b ends, so the test fails rather than hangs
                emit(Exited("b", 128 + signum))
                return
            if case == "connected-but-the-stop-word-lost":
                emit(Alive("b"))
            elif case == "re-attached-again-and-again-never-reporting" and len(b.reattached) > answered:
                answered = len(b.reattached)
                emit(Reattached("b"))

    try:
        result, _out, backend = run_job(script, tmp_path, observer=observer)
        took = time.monotonic() - signalled[0]
    finally:
        over.set()
    assert 1.5 <= took < 3.5, took
    assert result.exit_code == 128 + signum and result.signal == signum
    assert states(result) == {"a": RunState.STOPPED, "b": RunState.LOST}
    assert result.loss is None and result.first_failure is None  # lost while it stopped: not the cause
    assert backend.dropped == ["b"]  # no heartbeat goes to it any more: its node ends its part
    (lost,) = [r for r in result.hosts if r.host == "b"]
    assert re.match(r"b did not confirm the stop within \d+s \(its link ", lost.error or ""), lost.error
    assert str(summary(result)["stopped_by"]).startswith("stopped by ")


def test_a_ranks_own_error_replayed_after_a_peers_echo_is_the_failure_and_its_host_is_charged(
        tmp_path: Path) -> None:
    """Issue 54: SSH to b was cut while its rank failed; a's rank lost its peer, and that echo came
    first and stopped the job. b's records, replayed once b is reached again, hold the earlier error
    of its own: b is the host that failed, a was stopped, and the account charges b, as without the
    cut."""
    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b")])
        emit_all(emit, [Milestone(h, RankPhase(local, 2 * (h == "b") + local, "step", time.time(), None, 1))
                        for h in ("a", "b") for local in (0, 1)])  # every rank's first step: training
        keep_alive(emit, ["a", "b"], for_s=0.2)
        failed = time.time()  # b's rank, while b is cut off (not silent for long yet)
        keep_alive(emit, ["a"], for_s=0.3)
        echo = rank_error("Connection closed by peer [198.18.0.2]:4242", at=time.time())
        emit(phase("a", 0, 0, "error", echo.timestamp or 0.0, error=echo))
        assert b.stopped.wait(5)
        own = rank_error("bad batch at step 20", "ValueError", rank=1, at=failed)
        emit_all(emit, [Exited("a", 1), phase("b", 0, 1, "error", failed, error=own), Exited("b", 1)])

    result, _out, _backend = run_job(script, tmp_path)
    assert result.exit_code == 1 and result.loss is None
    assert result.root_cause is not None and result.root_cause.error.kind == "ValueError"
    assert result.first_failure is not None and result.first_failure.host == "b"
    assert states(result) == {"a": RunState.STOPPED, "b": RunState.FAILED}
    charged = account(read_events(path_of(tmp_path / result.job_id)))
    assert list(charged.by_host()) == ["b"], charged


def test_step_records_replayed_late_count_from_when_the_ranks_wrote_them(tmp_path: Path) -> None:
    """A job that ended while b was cut off: b's last step records come a second later, replayed
    once b is reached again. The account's productive time ends at the last step the ranks took,
    not when we heard of it (the wait for b is shut-down time, as without the cut)."""
    def steps(host: str, step: int, at: float) -> list[BackendEvent]:
        number = 2 * (host == "b")
        return [Milestone(host, RankPhase(local, number + local, "step", at, None, step)) for local in (0, 1)]

    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"), *steps("a", 1, time.time()), *steps("b", 1, time.time())])
        keep_alive(emit, ["a", "b"], for_s=0.2)
        last = time.time()  # the job's last step (b's ranks recorded it), then its end; b is not heard
        emit_all(emit, [*steps("a", 49, last), Exited("a", 0)])
        keep_alive(emit, ["a"], for_s=1.0)
        emit_all(emit, [Reattached("b"), *steps("b", 50, last), Exited("b", 0)])

    result, _out, _backend = run_job(script, tmp_path)
    assert result.exit_code == 0
    charged = account(read_events(path_of(tmp_path / result.job_id)))
    assert 0.1 < charged.productive_s < 0.6, charged


# -- the headline ----------------------------------------------------------------------------------

def print_failure_text(monkeypatch: pytest.MonkeyPatch, result: RunResult) -> str:
    buffer = io.StringIO()
    monkeypatch.setattr(up, "err_console", Console(file=buffer, width=300, color_system=None))
    up.print_failure(result)
    return buffer.getvalue()


def lost_result(tmp_path: Path, root: RankFailure | None) -> RunResult:
    runs = [HostRun("a", 0, "torchrun a", RunState.STOPPED), HostRun("b", 1, "torchrun b", RunState.LOST)]
    loss = HostLoss("b", "no contact with b for 60s (since 12:00:00): host down or network cut",
                    time.mktime((2026, 1, 2, 12, 1, 0, 0, 0, -1)))
    return RunResult(job_id="t-1", run_dir=tmp_path, hosts=runs, exit_code=1, first_failure=runs[1],
                     nprocs={"a": 2, "b": 2}, root_cause=root, loss=loss)


@pytest.mark.parametrize("with_echo", [True, False], ids=["with-a-consequence", "alone"])
def test_print_failure_heads_with_the_lost_host_then_its_consequence(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, with_echo: bool) -> None:
    echo = RankFailure("a", 0, RankError(1, "Connection closed by peer [198.18.0.2]:1234", "tb", 1.0, None,
                                         kind="RuntimeError"))
    text = print_failure_text(monkeypatch, lost_result(tmp_path, echo if with_echo else None))
    lines = [line for line in text.splitlines() if line]
    assert lines[0] == ("first failure: b lost at 12:01:00: no contact with b for 60s (since 12:00:00): host "
                        "down or network cut")
    consequence = ("  then, as a consequence: rank 1 on a: RuntimeError: Connection closed by peer "
                   "[198.18.0.2]:1234")
    assert lines[1:] == ([consequence] if with_echo else [])
    assert CLOCK.search(lines[0])


# -- the scheduler's own end (Slurm: an outside cancel, a time limit, a failed node) ---------------

CANCELLED = "Slurm job 34 was cancelled at 12:00:00, not by ddpctl"


@pytest.mark.parametrize("lost", [False, True], ids=["cancelled", "node-failed"])
def test_a_job_the_scheduler_ended_names_its_reason_blames_no_rank_and_stops_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, lost: bool) -> None:
    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"), Ended("b", CANCELLED, lost=lost),
                        phase("a", 0, 0, "error", error=rank_error("Connection closed by peer")),
                        Reported("a", SuperviseResult(1, "supervisor got signal 15", None, None, None, None)),
                        Exited("a", 1), Exited("b", 1)])

    result, out, backend = run_job(script, tmp_path)
    assert result.exit_code == (1 if lost else EXIT_STOPPED) and result.ended_by == CANCELLED  # a cancel: stopped
    assert backend.stops == []  # the scheduler is ending it: nothing for us to stop
    assert result.root_cause is None  # the rank that died of it is no failure
    assert states(result) == {"a": RunState.STOPPED, "b": RunState.LOST if lost else RunState.STOPPED}
    assert summary(result)["ended_by"] == CANCELLED
    text = print_failure_text(monkeypatch, result)
    lines = [line for line in text.splitlines() if line]
    if lost:
        assert result.loss is not None and result.loss.host == "b"
        assert lines == [f"first failure: b lost at {result.loss.when()}: {CANCELLED}"]
    else:
        assert lines == [f"stopped: {CANCELLED}", "  no rank failed: Slurm ended them (their lines are in "
                                                  "the logs)"]
        assert CANCELLED in out.notices


def test_a_signal_during_a_submission_lands_once_the_block_ends() -> None:
    """Slurm's sbatch must not be cut between submitting and recording the job id."""
    from orchestrator.launch.signals import StopSignal, stop_signals_deferred

    reached, before = [], signal.getsignal(signal.SIGTERM)
    with pytest.raises(StopSignal) as caught, stop_signals_deferred():
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once, in this thread: held, not raised
        reached.append("after the signal")
    assert reached == ["after the signal"] and caught.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is given back


# -- a stop from outside: `ddpctl down` from another terminal ------------------------------------------

DOWNED = "stopped by `ddpctl down` (by root on vm at 12:00:00)"


def test_ddpctl_down_is_the_headline_and_the_errors_after_it_its_consequences(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """down reached b first; a's rank then lost its peer (before b's report came): no first failure."""
    at = time.time()

    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b"),
                        phase("a", 0, 0, "error", error=rank_error("Read error: Connection reset by peer",
                                                                   at=at + 0.1)),
                        phase("b", 0, 1, "error", error=rank_error("got signal 15", "SignalException", at=at + 0.2)),
                        Reported("b", SuperviseResult(1, f"{DOWNED}: stopped by the control plane", None, None,
                                                      None, None, stopped_at=at)),
                        Exited("b", 1), Exited("a", 1)])

    result, _out, _backend = run_job(script, tmp_path)
    assert result.exit_code == EXIT_STOPPED and result.stopped_by == DOWNED
    assert result.root_cause is None and result.first_failure is None
    assert states(result) == {"a": RunState.STOPPED, "b": RunState.STOPPED}
    assert summary(result)["stopped_by"] == DOWNED
    lines = [line for line in print_failure_text(monkeypatch, result).splitlines() if line]
    assert lines[0] == DOWNED and not any("first failure" in line for line in lines)


def test_ctrl_c_is_the_headline_with_who_and_when_and_the_errors_after_it_its_consequences(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Ctrl-C to `up`: a's rank then loses its peer on b (gloo's 'Connection reset by peer'): no first
    failure, the stop is the headline, and `up` still exits 130."""
    observer = RunningObserver(2)

    def script(b: FaultyBackend, emit: Emit) -> None:
        emit_all(emit, [Started("a"), Started("b")])
        assert observer.running.wait(5)
        os.kill(os.getpid(), signal.SIGINT)
        assert b.stopped.wait(5)
        emit_all(emit, [phase("a", 0, 0, "error", error=rank_error("Read error: Connection reset by peer")),
                        Exited("a", 1), Exited("b", 130)])

    result, _out, _backend = run_job(script, tmp_path, observer=observer)
    assert result.exit_code == 130 and result.signal == signal.SIGINT
    assert result.root_cause is None and result.first_failure is None
    assert re.fullmatch(r"stopped by Ctrl-C \(by \S+ on \S+ at \d\d:\d\d:\d\d\)", result.stopped_by or ""), \
        result.stopped_by
    assert summary(result)["stopped_by"] == result.stopped_by
    lines = [line for line in print_failure_text(monkeypatch, result).splitlines() if line]
    assert lines[0] == result.stopped_by and not any("first failure" in line for line in lines)
