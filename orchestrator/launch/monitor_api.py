"""The seam between the supervision core and what watches a job from above (the rendezvous
watchdog, the hang timeout, progress and stalls, the report): a monitor receives the core's events
and ticks with a read-only view of the job, and returns actions, which are data. The core imports
no monitor; callers pass a MonitorFactory (orchestrator/watch/factory.py builds `up`'s)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator.checks.model import ProbeResults
from orchestrator.hostops.stacks import StacksReport
from orchestrator.launch.events import BackendEvent
from orchestrator.launch.faults import Link
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import LaunchPlan
from orchestrator.launch.progress import Status
from orchestrator.launch.result import Finding, HostRun, RunResult


class JobView(Protocol):
    """What a monitor may read of the running job (the core's own state; never to be changed)."""

    @property
    def plan(self) -> LaunchPlan: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def started(self) -> float:
        """time.time() the supervision began: findings' times are counted from it."""

    @property
    def runs(self) -> Mapping[str, HostRun]:
        """host -> its state, exit code and last lines."""

    @property
    def links(self) -> Mapping[str, Link]:
        """host -> its link's state in the fault model (orchestrator/launch/faults.py)."""

    @property
    def stopping(self) -> bool:
        """The job is being stopped (a failure, a monitor, a signal) or the scheduler ended it."""


# -- events the core adds to the backend's ------------------------------------------------------
@dataclass(frozen=True)
class HostLost:
    """The core judged a host lost (silent too long, its connection closed, blamed by its peers,
    or named failed by the scheduler)."""

    host: str
    why: str


MonitorEvent = BackendEvent | HostLost


# -- actions: what a monitor asks of the core -----------------------------------------------------
@dataclass(frozen=True)
class Say:
    """A notice for the user (the observer's on_notice)."""

    text: str


@dataclass(frozen=True)
class ShowProgress:
    """The job's progress now, for the observer's status line or pulse."""

    status: Status


@dataclass(frozen=True)
class DumpStacks:
    """Every rank's stack, saved as stacks-<why>-<time>.json/.txt in the run directory and shown;
    the report comes back to the monitor that asked (StacksDumped)."""

    why: str


@dataclass(frozen=True)
class Reprobe:
    """Doctor's TCP probe between the hosts, run again by the backend; the results come back to the
    monitor that asked (Probed)."""


@dataclass(frozen=True)
class Fail:
    """The job has failed in this monitor's judgement: `up` exits non-zero whatever its ranks do.
    `cause`: the diagnosis, which becomes the run's headline (RunResult.cause); `hung`: it hung."""

    cause: str | None = None
    hung: bool = False


@dataclass(frozen=True)
class Stop:
    """Stop the job on every host as failed; `reason` is the notice the user reads."""

    reason: str


@dataclass(frozen=True)
class Flag:
    """Tell a host that one of its ranks is named a straggler (or is back to pace): its metrics
    textfile says so (node_agent/runtime/metrics_file.py). A backend without a channel to its nodes
    (Slurm's batch nodes) lets it pass."""

    host: str
    local_rank: int
    straggler: bool


Action = Say | Finding | ShowProgress | DumpStacks | Reprobe | Fail | Stop | Flag


# -- replies: what the core hands back for a request ----------------------------------------------
@dataclass(frozen=True)
class StacksDumped:
    why: str
    report: StacksReport


@dataclass(frozen=True)
class Probed:
    probes: ProbeResults


Reply = StacksDumped | Probed


class Monitor(Protocol):
    """Watches one job from above the core: events and ticks in, actions out. Called on the core's
    own thread only, one at a time; the actions of one call are carried out, in order, before the
    next monitor is called."""

    def on_event(self, event: MonitorEvent, job: JobView) -> Sequence[Action]:
        """A backend event as the core handles it, or an event of the core's own (HostLost)."""

    def on_tick(self, job: JobView) -> Sequence[Action]:
        """The core's timer (twice a second): the time to judge what has not happened."""

    def on_reply(self, reply: Reply, job: JobView) -> Sequence[Action]:
        """The answer to this monitor's DumpStacks or Reprobe."""

    def finish(self, result: RunResult) -> Sequence[Action]:
        """The job is over and summary.json written (only Say is heard now)."""


class Quiet:
    """A monitor that does nothing: subclass it and override what you need."""

    def on_event(self, event: MonitorEvent, job: JobView) -> Sequence[Action]:
        return ()

    def on_tick(self, job: JobView) -> Sequence[Action]:
        return ()

    def on_reply(self, reply: Reply, job: JobView) -> Sequence[Action]:
        return ()

    def finish(self, result: RunResult) -> Sequence[Action]:
        return ()


MonitorFactory = Callable[[LaunchPlan, LaunchOptions], Sequence[Monitor]]


def no_monitors(_plan: LaunchPlan, _options: LaunchOptions) -> Sequence[Monitor]:
    return ()
