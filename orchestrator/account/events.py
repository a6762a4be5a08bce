"""A run's lifecycle as events: one JSON object per line in `runs/<run id>/events.jsonl`, appended
as the run goes (attempt start, first step, contact lost/back, lost, fence start/end, restart,
straggler, checkpoint seen, stop, end), each with its time, attempt, host and cause. The account
(compute.py) is a function of this file alone: anyone can recompute it."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FILE_NAME = "events.jsonl"

# The kinds, in the order a run meets them. What each one's fields mean: docs/running.md ("Where the
# time went").
RUN_START = "run start"  # job, hosts, checkpoints (whether [restart] checkpoint_dir is set)
ATTEMPT_START = "attempt start"  # attempt, hosts
QUEUED = "queued"  # the scheduler holds the job (Slurm: pending)
RUNNING = "running"  # the scheduler runs it
LAUNCH = "launch"  # the plan is settled (checks, sync, port): the hosts start the job now
FIRST_STEP = "first step"  # every rank has taken an optimizer step (or the first did, where not all say)
PROGRESS = "progress"  # step: the most optimizer steps of any rank, now and then
CHECKPOINT = "checkpoint"  # host: a newer file in [restart] checkpoint_dir, t its time; step then
CONTACT_LOST = "contact lost"  # host: its last word (t) before a silence
CONTACT_BACK = "contact back"  # host: heard again
LOST = "lost"  # host, cause: the verdict
FAILED = "failed"  # host, cause: the failure that stopped the attempt
STALL_START = "stall start"  # no optimizer step since t (a hang or no-progress finding)
STALL_END = "stall end"  # steps again
STRAGGLER = "straggler"  # host, rank, end, slower: a straggler finding, start (t) to end
STOP = "stop"  # cause: someone stopped the run (Ctrl-C, a signal, `ddpctl down`, the scheduler)
REQUEUED = "requeued"  # the scheduler requeued the job: its ranks start again
ATTEMPT_END = "attempt end"  # attempt, exit_code, step, last_step (its time), outcome, hosts charged
FENCE_START = "fence start"  # hosts: the lost hosts being reached or waited out
FENCE_END = "fence end"
BACKOFF_START = "backoff start"
BACKOFF_END = "backoff end"
RESTART = "restart"  # attempt (the next), cause, hosts: what the restart is charged to
RUN_END = "run end"  # exit_code, outcome

KINDS = (RUN_START, ATTEMPT_START, QUEUED, RUNNING, LAUNCH, FIRST_STEP, PROGRESS, CHECKPOINT, CONTACT_LOST,
         CONTACT_BACK, LOST, FAILED, STALL_START, STALL_END, STRAGGLER, STOP, REQUEUED, ATTEMPT_END, FENCE_START,
         FENCE_END, BACKOFF_START, BACKOFF_END, RESTART, RUN_END)


@dataclass(frozen=True)
class Event:
    """One line of events.jsonl."""

    t: float  # time.time()
    kind: str
    attempt: int | None = None
    host: str | None = None
    cause: str | None = None
    step: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": round(self.t, 3), "event": self.kind}
        for key in ("attempt", "host", "cause", "step"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        extra = {k: v for k, v in data.items() if k not in ("t", "event", "attempt", "host", "cause", "step")}
        return cls(float(data["t"]), str(data["event"]), _int(data.get("attempt")), _str(data.get("host")),
                   _str(data.get("cause")), _int(data.get("step")), extra)

    def get(self, key: str, default: Any = None) -> Any:
        return self.extra.get(key, default)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def path_of(run_dir: Path) -> Path:
    return run_dir / FILE_NAME


class EventLog:
    """Appends a run's events to its events.jsonl, a line at a time (a run killed midway keeps
    what it had). Until the run's directory exists (a launch makes it once its checks pass) the
    events are held, so a launch that never starts leaves nothing behind. An unwritable file costs
    the account, never the run: it goes quiet."""

    def __init__(self, run_dir: Path | None) -> None:
        self.run_dir = run_dir
        self.path = path_of(run_dir) if run_dir is not None else None
        self.broken: str | None = None  # why the file could not be written (once)
        self.held: list[Event] = []

    def add(self, kind: str, t: float | None = None, *, attempt: int | None = None, host: str | None = None,
            cause: str | None = None, step: int | None = None, **extra: Any) -> Event:
        event = Event(time.time() if t is None else t, kind, attempt, host, cause, step, extra)
        if self.path is None or self.run_dir is None or self.broken is not None:
            return event
        self.held.append(event)
        if not self.run_dir.is_dir():
            return event
        lines, self.held = [json.dumps(e.to_json(), default=str) + "\n" for e in self.held], []
        try:
            with self.path.open("a", encoding="utf-8") as out:
                out.write("".join(lines))
        except OSError as exc:
            self.broken = f"{self.path}: {exc.strerror or exc}"
        return event

    def events(self) -> list[Event]:
        """What the file holds, and what is held for it."""
        written = read(self.path) if self.path is not None and self.path.exists() else []
        return [*written, *self.held]


def read(path: Path) -> list[Event]:
    """The events of a run, in the order written; a torn or foreign line is skipped."""
    return list(parse(path.read_text(encoding="utf-8", errors="replace").splitlines()))


def parse(lines: Sequence[str]) -> Iterator[Event]:
    for line in lines:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            data = json.loads(line)
            if isinstance(data, dict):
                yield Event.from_json(data)
