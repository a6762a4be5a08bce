"""The hosts of a supervised job: each host's run (state, exit code, last lines), its link in the
fault model's states (orchestrator/launch/faults.py), when it was last heard from, and by when a
stop asked of them must be confirmed."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator.launch.events import Alive, BackendEvent
from orchestrator.launch.faults import FaultLimits, Link, LinkState, link_state_after
from orchestrator.launch.plan import LaunchPlan
from orchestrator.launch.result import HostRun, RunState


class Contact:
    """When each host was last heard from, recorded as its events arrive (from any backend thread),
    not when they are handled: a reader waiting for room in the output lane is not a silent host."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # a re-attached host's old and new reader may both be blocked
        self.last_heard: dict[str, float] = {}  # host -> time.monotonic() of its latest event
        self.blocked_readers: dict[str, int] = {}  # host -> its readers waiting on our own backlog
        self.unheard_by_node: dict[str, float] = {}  # host -> seconds it says it has not heard us

    def heard(self, event: BackendEvent) -> None:
        self.last_heard[event.host] = time.monotonic()
        if isinstance(event, Alive) and event.heard_s is not None:
            self.unheard_by_node[event.host] = float(event.heard_s)

    @contextlib.contextmanager
    def reader_blocked(self, host: str) -> Iterator[None]:
        """The block in which one of `host`'s readers waits for room; heard from again after it."""
        with self.lock:
            self.blocked_readers[host] = self.blocked_readers.get(host, 0) + 1
        try:
            yield
        finally:
            with self.lock:
                self.blocked_readers[host] -= 1
            self.last_heard[host] = time.monotonic()

    def quiet_s(self, host: str, now: float) -> float:
        """Seconds without contact either way (none while a reader of the host is blocked on us)."""
        quiet = 0.0 if self.blocked_readers.get(host) else now - self.last_heard.get(host, now)
        return max(quiet, self.unheard_by_node.get(host, 0.0))

    def reattached(self, host: str) -> None:
        self.unheard_by_node.pop(host, None)


@dataclass(frozen=True)
class LinkMove:
    """A host's link moves to `state` after `quiet_s` seconds without contact."""

    host: str
    state: LinkState
    quiet_s: float


class Hosts:
    """Every host's run and link, and the fault model applied to them."""

    def __init__(self, plan: LaunchPlan, limits: FaultLimits) -> None:
        self.limits = limits
        self.runs = {hl.host.name: HostRun(hl.host.name, hl.node_rank, hl.display()) for hl in plan.hosts}
        self.links = {name: Link(name) for name in self.runs}
        self.contact = Contact()
        self.addresses = {hl.host.name: hl.host.address for hl in plan.hosts}
        self.stop_since: float | None = None  # time.monotonic() the first stop was asked
        self.stop_deadline: float | None = None  # ... and by when every host must have confirmed one

    def stop_asked(self, now: float, bound: float) -> None:
        """A stop was asked at `now` (time.monotonic()): each unfinished host must confirm it within
        `bound` s (faults.FaultLimits.stop_bound); an earlier deadline stands."""
        self.stop_since = now if self.stop_since is None else self.stop_since
        deadline = now + bound
        self.stop_deadline = deadline if self.stop_deadline is None else min(self.stop_deadline, deadline)

    def unconfirmed(self, now: float) -> list[str]:
        """The unfinished hosts once the stop's deadline has passed (none before it)."""
        if self.stop_deadline is None or now < self.stop_deadline:
            return []
        return self.unfinished()

    def moves(self, now: float) -> list[LinkMove]:
        """The links of running (or stopping) hosts that change state now (faults.link_state_after)."""
        moves = []
        for name, run in self.runs.items():
            if run.state not in (RunState.RUNNING, RunState.STOPPING):
                continue
            quiet = self.contact.quiet_s(name, now)
            state = link_state_after(self.links[name], quiet, self.limits)
            if state is not None:
                moves.append(LinkMove(name, state, quiet))
        return moves

    def unfinished(self) -> list[str]:
        return [name for name, run in self.runs.items() if not run.done]

    def silent(self) -> list[str]:
        """Unfinished hosts whose link is silent."""
        return [name for name in self.unfinished() if self.links[name].state is LinkState.SILENT]

    def all_done(self) -> bool:
        return all(run.done for run in self.runs.values())

    def lose(self, run: HostRun, why: str) -> None:
        """The host is lost: its run and its link say so from now on."""
        run.state, run.error, run.ended_at = RunState.LOST, why, time.time()
        self.links[run.host].enter(LinkState.LOST)
