"""The quarantine policy, pure: a host's ledger events (orchestrator/hostops/ledger.py) -> its state
(ok, suspect, quarantined), the reason in one line (with the time its faults cost the runs, where
the ledger has their accounts), and the mean time between its faults."""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from inventory import Inventory, Job
from inventory.model import DEFAULT_QUARANTINE_AFTER, DEFAULT_QUARANTINE_WINDOW
from orchestrator.account import text


class EventKind(str, enum.Enum):
    """What the ledger records of a host, besides its runs."""

    LOST = "lost"  # the launch lost the host (the fault model)
    HOST_FAULT = "host_fault"  # a host fault of the restart classification (a SIGKILLed rank, a listed exit code)
    HARDWARE = "hardware"  # a hardware line in its output (Xid, ECC, fallen off the bus)
    STRAGGLER = "straggler"  # a straggler finding of `up`'s watch
    FINDING = "finding"  # a doctor finding (a failed or warned check)
    DEEP_FINDING = "deep_finding"  # a deep check's finding: the host is suspect until released
    RELEASE = "release"  # `ddpctl hosts --release`: the faults before it no longer count


# The kinds that count toward quarantine.
FAULTS = frozenset({EventKind.LOST, EventKind.HOST_FAULT, EventKind.HARDWARE})


@dataclass(frozen=True)
class Event:
    """One thing the ledger learned about one host."""

    at: float  # time.time()
    kind: EventKind
    detail: str
    run_id: str | None = None


@dataclass(frozen=True)
class Cost:
    """What a host cost one run: the seconds of the run's account charged to it, and their causes."""

    at: float  # the run's end
    run_id: str
    seconds: float
    causes: str  # "lost, SIGKILL": the costliest first


@dataclass(frozen=True)
class Spent:
    """A host's costs in a window: the seconds in all, in how many runs."""

    seconds: float = 0.0
    runs: int = 0

    def text(self) -> str:
        """`2.3 min in 3 runs`; `-` for none."""
        if self.runs == 0:
            return "-"
        return f"{text.seconds(self.seconds)} in {self.runs} run{'s' if self.runs != 1 else ''}"


def spent(costs: Sequence[Cost], since: float) -> Spent:
    """The costs at or after `since`."""
    recent = [c for c in costs if c.at >= since]
    return Spent(sum(c.seconds for c in recent), len({c.run_id for c in recent}))


class LedgerState(str, enum.Enum):
    """The ledger's verdict on a host (Judgement.state)."""

    OK = "ok"
    SUSPECT = "suspect"  # named by `up`, kept
    QUARANTINED = "quarantined"  # left out by `up` and by every restart attempt


@dataclass(frozen=True)
class Policy:
    """[defaults] quarantine, quarantine_after, quarantine_window (the job's [restart] quarantine too)."""

    enabled: bool = True
    after: int = DEFAULT_QUARANTINE_AFTER
    window: float = DEFAULT_QUARANTINE_WINDOW

    @classmethod
    def of(cls, inventory: Inventory, job: Job | None = None) -> Policy:
        enabled = inventory.quarantine and (job is None or job.restart.quarantine)
        return cls(enabled, inventory.quarantine_after, inventory.quarantine_window)


@dataclass(frozen=True)
class Judgement:
    """A host's state under a policy, and why."""

    state: LedgerState
    reason: str | None  # one line; None: ok
    faults: tuple[Event, ...]  # the host faults since its last release, oldest first
    mtbf: float | None  # mean seconds between two host faults (every one kept); None: fewer than 2
    counted: tuple[Event, ...] = ()  # those of `faults` within the window: what the quarantine counts


def duration(seconds: float) -> str:
    """24 h, 30 min, 90 s, 7 d: the window as people write it."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= max(size, 2 * 86400 if unit == "d" else 0) and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def label(event: Event) -> str:
    """A fault in a word or two: lost, SIGKILL, hardware, exit code 75, or its own words."""
    if event.kind is EventKind.LOST:
        return "lost"
    if event.kind is EventKind.HARDWARE:
        return "hardware error"
    if "SIGKILL" in event.detail:
        return "SIGKILL"
    if "exited with code" in event.detail:
        return "exit code " + event.detail.split("exited with code", 1)[1].split()[0].strip(",")
    return event.detail[:60]


def fault_text(event: Event) -> str:
    """`lost at 10:02 (run train-…)`."""
    run = f" (run {event.run_id})" if event.run_id else ""
    return f"{label(event)} at {time.strftime('%H:%M', time.localtime(event.at))}{run}"


def since_release(events: Sequence[Event]) -> list[Event]:
    """The events after the last release, oldest first."""
    ordered = sorted(events, key=lambda e: e.at)
    last = max((i for i, e in enumerate(ordered) if e.kind is EventKind.RELEASE), default=-1)
    return ordered[last + 1:]


def mean_between(events: Sequence[Event]) -> float | None:
    times = sorted(e.at for e in events if e.kind in FAULTS)
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


def judge(events: Sequence[Event], policy: Policy, now: float | None = None, costs: Sequence[Cost] = ()) -> Judgement:
    """A host's state: quarantined with `policy.after` host faults within `policy.window` since its
    last release; suspect with one (or more, where the quarantine is off), or a deep check's finding
    since its last release; else ok. The reason says what the host cost the runs (`costs`) in the
    window since its last release, where that rounds to a second or more."""
    now = time.time() if now is None else now
    current = since_release(events)
    faults = tuple(e for e in current if e.kind in FAULTS)
    recent = tuple(e for e in faults if now - e.at <= policy.window)
    mtbf = mean_between(events)
    listed = ", ".join(fault_text(e) for e in recent[-policy.after:])
    released = max((e.at for e in events if e.kind is EventKind.RELEASE), default=-math.inf)
    cost = spent(costs, max(now - policy.window, released))
    costing = f", costing {text.seconds(cost.seconds)}" if cost.seconds >= text.SHOWN_FROM_S else ""
    if len(recent) >= policy.after:
        reason = f"{len(recent)} host faults in {duration(policy.window)}{costing}: {listed}"
        if policy.enabled:
            return Judgement(LedgerState.QUARANTINED, reason, faults, mtbf, recent)
        return Judgement(LedgerState.SUSPECT, reason + " (quarantine is off)", faults, mtbf, recent)
    if recent:
        reason = f"{len(recent)} host fault(s) in {duration(policy.window)}{costing}: {listed}"
        return Judgement(LedgerState.SUSPECT, reason, faults, mtbf, recent)
    deep = [e for e in current if e.kind is EventKind.DEEP_FINDING]
    if deep:
        return Judgement(LedgerState.SUSPECT, f"deep check: {deep[-1].detail}", faults, mtbf)
    return Judgement(LedgerState.OK, None, faults, mtbf)
