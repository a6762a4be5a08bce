"""`doctor --deep`: doctor's side of the host check, watched from the lines each host's check prints
(train_jobs/hostcheck/figures.py: STARTED, JOINED, SERVING, the figures) and each node's end.

Its end: once node 0 has printed the figures, the hosts still at it (late, starved, stuck in an
exchange) are stopped: they are named already, and nothing waits for them.

Its start: node 0 coordinates the check and names a host that has not joined by the join deadline
(train_jobs/hostcheck/coordinate.py); where node 0 itself cannot start (its torchrun or Python fails,
its store cannot serve, it is starved) no one names anyone, and the others would wait for its store
until their own timeout. So the job is stopped, naming the hosts that did not start:

- at once, when node 0 ends before it printed the figures;
- when node 0's store does not serve by the start deadline (schedule.start_deadline: the join
  deadline on the times the hosts took to start, from the first torchrun's start; a floor while no
  host has started).

What it saw of each host is its `StartReport`; orchestrator/doctor/deep.py turns it into findings
with the tail of each named host's output. Its clock is the coordinator's (coordinate.Clock), which
the unit tests simulate.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.launch.events import Exited, Lost, Output, Started
from orchestrator.launch.monitor_api import Action, HostLost, JobView, MonitorEvent, Quiet, Stop
from train_jobs.hostcheck.coordinate import Clock
from train_jobs.hostcheck.figures import JOINED, RESULT, SERVING, STARTED
from train_jobs.hostcheck.schedule import start_deadline


@dataclass
class HostStart:
    """What one host's check did as it started, in seconds after the first torchrun started."""

    started: float | None = None  # its start line (node 0: its store serving)
    joined: bool = False  # it reached node 0's store
    ended: str | None = None  # its node ended on its own before it joined (node 0: before its figures): how


@dataclass(frozen=True)
class NotStarted:
    """A host named for its start: `text` is the finding's message, `failed` an error (it ended)
    rather than a warning (it was late)."""

    host: str
    text: str
    failed: bool
    after_s: float  # the deadline, or when it ended
    others_s: float | None  # the median start of the hosts that started


@dataclass(frozen=True)
class StartReport:
    """The watch's account: each host's start, and where node 0 never coordinated (the watch
    stopped the job), the hosts it named."""

    hosts: dict[str, HostStart]
    no_coordinator: bool
    named: tuple[NotStarted, ...] = ()


def _ended(event: MonitorEvent) -> str | None:
    """How a node ended, in words, where the event says it did."""
    if isinstance(event, Exited):
        return f"exited with code {event.exit_code}" if event.exit_code is not None else "its connection closed"
    if isinstance(event, (Lost, HostLost)):
        return f"lost: {event.reason if isinstance(event, Lost) else event.why}"
    return None


AT_RESULT = "the host check has its figures: stopping the hosts still at it"


@dataclass
class HostCheckWatch(Quiet):
    """The monitor: `hosts` by node rank (node 0 first, the coordinator)."""

    hosts: Sequence[str]
    clock: Clock = field(default_factory=Clock)
    starts: dict[str, HostStart] = field(default_factory=dict)
    launched: float | None = None  # the first torchrun's start, on the clock
    result: bool = False  # node 0 printed its figures: the coordinator has done its part
    named: tuple[NotStarted, ...] | None = None  # set once it stopped the job for lack of a coordinator
    stopped: bool = False  # it asked for the stop (at the figures, or for lack of a coordinator)

    def __post_init__(self) -> None:
        self.starts = {host: HostStart() for host in self.hosts}

    def on_event(self, event: MonitorEvent, job: JobView) -> Sequence[Action]:
        now = self.clock.now()
        if isinstance(event, Started) and self.launched is None:
            self.launched = now
        elif isinstance(event, Output) and event.host in self.starts:
            self._read(event.host, event.lines, now)
        elif (how := _ended(event)) is not None and event.host in self.starts and not (self.stopped or job.stopping):
            start = self.starts[event.host]  # it ended on its own: not stopped by us (at the figures) or a signal
            if start.ended is None and (not start.joined or event.host == self.hosts[0]):
                start.ended = how
        return self._judge(now, job)

    def on_tick(self, job: JobView) -> Sequence[Action]:
        return self._judge(self.clock.now(), job)

    def _read(self, host: str, lines: Sequence[str], now: float) -> None:
        start = self.starts[host]
        coordinator = host == self.hosts[0]
        for line in lines:
            if (SERVING in line if coordinator else STARTED in line) and start.started is None:
                start.started = now - (self.launched if self.launched is not None else now)
            elif JOINED in line:
                start.joined = True
            elif coordinator and RESULT in line:
                self.result = True

    def deadline(self) -> float:
        """Seconds after the first torchrun's start by which node 0's store must serve."""
        return start_deadline([s.started for s in self.starts.values() if s.started is not None])

    def _judge(self, now: float, job: JobView) -> Sequence[Action]:
        if self.result and not self.stopped:
            self.stopped = True
            return (Stop(AT_RESULT),)
        if self.stopped or job.stopping or self.launched is None:  # done, or stopped by another (a signal)
            return ()
        node0 = self.starts[self.hosts[0]]
        if node0.ended is None and (node0.started is not None or now - self.launched < self.deadline()):
            return ()
        self.named = tuple(self._named(now - self.launched))
        self.stopped = True
        what = f"ended ({node0.ended})" if node0.ended else f"did not start in {now - self.launched:.0f} s"
        return (Stop(f"the host check's coordinator, node 0 ({self.hosts[0]}), {what}: no host can be checked; "
                     "stopping the job"),)

    def _named(self, elapsed: float) -> list[NotStarted]:
        """Node 0, and each host that had not started when the job was stopped."""
        others = [s.started for h, s in self.starts.items() if s.started is not None and h != self.hosts[0]]
        median = statistics.median(others) if others else None
        took = "" if median is None else f"; the others started in {median:.1f} s"
        out = []
        for rank, host in enumerate(self.hosts):
            start = self.starts[host]
            if start.ended is not None and (start.started is None or rank == 0):
                text = (f"its host check ended before the figures ({start.ended}): node 0 coordinates the check"
                        if start.started is not None else f"could not start its host check ({start.ended})")
                out.append(NotStarted(host, text, True, elapsed, median))
            elif start.started is None:
                out.append(NotStarted(host, f"did not start its host check in {elapsed:.0f} s{took} (a starved "
                                            "or overloaded host)", False, elapsed, median))
        return out

    def report(self) -> StartReport:
        return StartReport(dict(self.starts), self.named is not None, self.named or ())
