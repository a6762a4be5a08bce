"""The account of a run, a pure function of its events (events.py): the wall time from its start to
its end cut into productive steps and each kind of loss, each loss charged to a cause and, where
one is at fault, a host. The parts add up to the wall time by construction: every instant of it is
given to exactly one part (the one of highest precedence that covers it), and two fractional
parts (re-done work, straggler time) are moved out of the productive time they were part of.

What each part is (docs/running.md, "Where the time went"):
- start-up: from the start to every rank's first step (checks, sync, launch, imports, rendezvous);
- detection: from a lost host's last word to the verdict that it is lost;
- fencing: the lost hosts reached (their part ended) or waited out before the next attempt;
- backoff: the wait before the next attempt;
- relaunch: the rest, from a failure to the next attempt's first step;
- re-done: steps taken after the last checkpoint before a failure, which the next attempt repeats
  (known only where ddpctl sees [restart] checkpoint_dir);
- no progress: a stall or a hang, from the last step to the next (or to the end);
- straggler: what the other ranks spent waiting for a straggler while its finding was open;
- pending, requeue: the scheduler's waits (Slurm's queue; a requeue to the next first step);
- stopped: from a stop (Ctrl-C, a signal, `ddpctl down`, the scheduler) to the end;
- failure: from a failure that ended the run to its end;
- shutdown: from the last step of a run that succeeded to its end (saving, exiting)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.account import events as ev
from orchestrator.account.events import Event

PRODUCTIVE = "productive"
STARTUP = "start-up"
PENDING = "pending"
DETECTION = "detection"
FENCING = "fencing"
BACKOFF = "backoff"
RELAUNCH = "relaunch"
REDONE = "re-done"
NO_PROGRESS = "no progress"
STRAGGLER = "straggler"
REQUEUE = "requeue"
STOPPED = "stopped"
FAILURE = "failure"
SHUTDOWN = "shutdown"
OTHER = "other"  # time no event accounts for (a run cut short mid-write)
LOSSES = (DETECTION, FENCING, BACKOFF, RELAUNCH, REDONE, NO_PROGRESS, STRAGGLER, PENDING, REQUEUE, STARTUP,
          STOPPED, FAILURE, SHUTDOWN, OTHER)

# Precedence where parts overlap: a stop or the queue over all; fencing and backoff over the relaunch
# they are part of; a lost host's silence over the steps the others took meanwhile; a stall over steps.
PRECEDENCE = {PENDING: 6, STOPPED: 5, FENCING: 4, BACKOFF: 4, REQUEUE: 4, DETECTION: 3, NO_PROGRESS: 2}


@dataclass(frozen=True)
class Charge:
    """Who or what a loss is charged to: a host (None: no host is at fault) and a cause."""

    host: str | None
    cause: str


NOBODY = Charge(None, "")


@dataclass(frozen=True)
class Part:
    """One kind of loss charged to one cause and host, in seconds."""

    kind: str
    seconds: float
    host: str | None
    cause: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "seconds": round(self.seconds, 3), "host": self.host, "cause": self.cause}


@dataclass(frozen=True)
class Redone:
    """The steps a later attempt repeats: known only where ddpctl sees [restart] checkpoint_dir."""

    known: bool
    seconds: float = 0.0
    steps: int | None = None
    since_step: int | None = None  # the step of the last checkpoint before the failure (None: more than one)

    def to_json(self) -> dict[str, Any]:
        return {"known": self.known, "seconds": round(self.seconds, 3), "steps": self.steps,
                "since_step": self.since_step}


@dataclass(frozen=True)
class Account:
    """Where a run's wall time went."""

    run_id: str | None
    job: str | None
    started: float
    ended: float
    productive_s: float
    parts: tuple[Part, ...]
    redone: Redone
    attempts: int
    outcome: str  # "ok", "failed", "stopped", "running" (no end event yet)
    restarted: bool = False  # some attempt was run again (re-done work can be)
    stepped: bool = True  # some rank took an optimizer step (else what was productive is not known)

    @property
    def wall_s(self) -> float:
        return max(self.ended - self.started, 0.0)

    @property
    def goodput(self) -> float | None:
        return self.productive_s / self.wall_s if self.wall_s > 0 and self.stepped else None

    def by_host(self) -> dict[str, float]:
        """Each host's charged losses, most first."""
        return totals((p.host, p.seconds) for p in self.parts if p.host is not None)

    def by_kind(self) -> dict[str, float]:
        """Each kind of loss, most first."""
        return totals((p.kind, p.seconds) for p in self.parts)

    def biggest(self) -> tuple[str, float] | None:
        """The biggest loss: a host's charge (all its kinds), else a kind of loss no host is charged."""
        groups = self.by_host()
        for part in self.parts:
            if part.host is None:
                groups[part.kind] = groups.get(part.kind, 0.0) + part.seconds
        if not groups:
            return None
        name, seconds = max(groups.items(), key=lambda kv: kv[1])
        return (name, seconds) if seconds > 0 else None

    def to_json(self) -> dict[str, Any]:
        productive = round(self.productive_s, 3)  # goodput from the figure written: from_json gives it back the same
        goodput = productive / self.wall_s if self.wall_s > 0 and self.stepped else None
        return {"run_id": self.run_id, "job": self.job, "started": self.started, "ended": self.ended,
                "wall_s": round(self.wall_s, 3), "productive_s": productive,
                "goodput": None if goodput is None else round(goodput, 4), "attempts": self.attempts,
                "outcome": self.outcome, "restarted": self.restarted, "stepped": self.stepped,
                "parts": [p.to_json() for p in self.parts],
                "hosts": {h: round(s, 3) for h, s in self.by_host().items()},
                "redone": self.redone.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Account:
        redone = data.get("redone") or {}
        return cls(data.get("run_id"), data.get("job"), float(data["started"]), float(data["ended"]),
                   float(data["productive_s"]),
                   tuple(Part(str(p["kind"]), float(p["seconds"]), p.get("host"), str(p.get("cause") or ""))
                         for p in data.get("parts") or ()),
                   Redone(bool(redone.get("known")), float(redone.get("seconds") or 0.0), redone.get("steps"),
                          redone.get("since_step")),
                   int(data.get("attempts") or 0), str(data.get("outcome") or "?"), bool(data.get("restarted")),
                   bool(data.get("stepped", True)))


def totals(pairs: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Seconds summed by name, most first."""
    out: dict[str, float] = {}
    for name, seconds in pairs:
        out[name] = out.get(name, 0.0) + seconds
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


# -- the timeline ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Piece:
    start: float
    end: float
    kind: str
    charge: Charge


@dataclass
class AttemptSpan:
    number: int
    start: float
    end: float | None = None
    first_step: float | None = None
    last_step: float | None = None
    outcome: str | None = None
    fail_at: float | None = None  # when the failure began (a lost host's last word, a rank's error)
    fail_charge: Charge = NOBODY  # the host and cause of the failure that ended it
    restart: Charge | None = None  # what the next attempt is charged to (None: not restarted)
    events: list[Event] = field(default_factory=list)


def account(events: Sequence[Event], now: float | None = None) -> Account:
    """The account of one run from its events (`now`: the end of a run still going)."""
    events = sorted(events, key=lambda e: e.t)  # stable: the file's order among equal times
    if not events:
        raise ValueError("no events")
    first = next((e for e in events if e.kind == ev.RUN_START), events[0])
    last = next((e for e in reversed(events) if e.kind == ev.RUN_END), None)
    start = first.t
    end = last.t if last is not None else max(now if now is not None else events[-1].t, events[-1].t)
    checkpoints_known = bool(first.get("checkpoints")) if first.kind == ev.RUN_START else False
    attempts = _attempts(events, start, end)
    pieces = _pieces(events, attempts, start, end)
    segments = _sweep(pieces, start, end)
    redone, moved = _redone(events, attempts, segments, checkpoints_known)
    straggled = _straggled(events, attempts, segments)
    totals: dict[tuple[str, Charge], float] = {}
    productive = 0.0
    for a, b, piece in segments:
        if piece.kind == PRODUCTIVE:
            productive += b - a
        else:
            key = (piece.kind, piece.charge)
            totals[key] = totals.get(key, 0.0) + (b - a)
    for key, seconds in [*moved.items(), *straggled.items()]:
        productive -= seconds
        totals[key] = totals.get(key, 0.0) + seconds
    parts = tuple(sorted((Part(kind, s, c.host, c.cause) for (kind, c), s in totals.items() if s > 0),
                         key=lambda p: (-p.seconds, p.kind)))
    outcome = str(last.get("outcome") or "?") if last is not None else "running"
    return Account(str(first.get("run_id")) if first.get("run_id") else None,
                   str(first.get("job")) if first.get("job") else None, start, end, max(productive, 0.0), parts,
                   redone, len(attempts), outcome, any(a.restart is not None for a in attempts),
                   any(e.kind == ev.FIRST_STEP for e in events))


def _attempts(events: Sequence[Event], start: float, end: float) -> list[AttemptSpan]:
    spans: dict[int, AttemptSpan] = {}
    for e in events:
        n = e.attempt if e.attempt is not None else 0
        if e.kind in (ev.RUN_START, ev.RUN_END):
            continue
        span = spans.get(n)
        if span is None:
            span = spans[n] = AttemptSpan(n, start if n == 0 else e.t)
        span.events.append(e)
        if e.kind == ev.ATTEMPT_START and n > 0:
            span.start = e.t
        elif e.kind == ev.FIRST_STEP and span.first_step is None:
            span.first_step = e.t
        elif e.kind == ev.ATTEMPT_END:
            span.end, span.outcome = e.t, str(e.get("outcome") or "failed")
            last_step = e.get("last_step")
            if isinstance(last_step, (int, float)):
                span.last_step = float(last_step)
        elif e.kind == ev.RESTART and n > 0 and n - 1 in spans:
            spans[n - 1].restart = Charge(e.host, e.cause or "")
        if e.kind in (ev.FIRST_STEP, ev.PROGRESS):
            span.last_step = max(span.last_step or e.t, e.t)
    ordered = [spans[n] for n in sorted(spans)]
    for span, after in zip(ordered, [*ordered[1:], None], strict=True):
        if span.end is None:
            span.end = after.start if after is not None else end
        _failure(span)
    return ordered


def _failure(span: AttemptSpan) -> None:
    """When and by whom the attempt failed: a lost host from its last word, else the first failure."""
    lost = [e for e in span.events if e.kind == ev.LOST]
    failed = next((e for e in span.events if e.kind == ev.FAILED), None)
    if lost:
        first = lost[0]
        span.fail_at = min(_silent_since(span.events, e) for e in lost)
        span.fail_charge = Charge(first.host, "lost")
    elif failed is not None:
        span.fail_at = failed.t
        span.fail_charge = Charge(failed.host, failed.cause or "failed")
    stop = next((e for e in span.events if e.kind in (ev.STOP, ev.REQUEUED)), None)
    if span.fail_at is None and stop is not None and span.outcome != "ok":
        span.fail_at = stop.t


def _silent_since(events: Sequence[Event], lost: Event) -> float:
    """A lost host's last word: the start of its silence that its loss ended (its verdict time
    where it was never silent: a closed connection is lost at once)."""
    since = lost.t
    for e in events:
        if e.t > lost.t:
            break
        if e.host == lost.host and e.kind == ev.CONTACT_LOST:
            since = e.t if since == lost.t else since
        elif e.host == lost.host and e.kind == ev.CONTACT_BACK:
            since = lost.t
    return min(since, lost.t)


def _pieces(events: Sequence[Event], attempts: Sequence[AttemptSpan], start: float, end: float) -> list[Piece]:
    pieces: list[Piece] = []
    previous: AttemptSpan | None = None
    for span in attempts:
        assert span.end is not None
        begin = start if previous is None else span.start
        if previous is not None and previous.end is not None and previous.end < span.start:
            pieces.append(Piece(previous.end, span.start, RELAUNCH, previous.restart or previous.fail_charge))
        lead = STARTUP if previous is None else RELAUNCH
        lead_charge = Charge(None, "start-up") if previous is None else (previous.restart or previous.fail_charge)
        stepped = span.first_step if span.first_step is not None else span.end
        pieces.append(Piece(begin, stepped, lead, lead_charge))
        until = span.end
        if span.first_step is not None:
            until = min(max(span.last_step or span.first_step, span.first_step), span.end)
            if span.outcome != "ok" and span.fail_at is not None:
                until = min(until, max(span.fail_at, span.first_step))
            pieces.append(Piece(span.first_step, until, PRODUCTIVE, NOBODY))
        kind, charge = _tail(span, events)
        tail_end = end if span is attempts[-1] else span.end
        pieces.append(Piece(until, tail_end, kind, charge))
        pieces.extend(_overlays(span))
        previous = span
    for e in events:
        if e.kind == ev.STOP:
            pieces.append(Piece(e.t, end, STOPPED, Charge(None, e.cause or "stopped")))
    return pieces


def _tail(span: AttemptSpan, events: Sequence[Event]) -> tuple[str, Charge]:
    """What the time from an attempt's last step (or its failure) to its end is."""
    if span.outcome == "ok":
        return SHUTDOWN, Charge(None, "finishing")
    if span.restart is not None:
        return RELAUNCH, span.restart
    if span.outcome == "stopped":
        stop = next((e for e in span.events if e.kind == ev.STOP), None)
        return STOPPED, Charge(None, stop.cause if stop is not None and stop.cause else "stopped")
    return FAILURE, span.fail_charge if span.fail_charge != NOBODY else Charge(None, "failed")


def _overlays(span: AttemptSpan) -> list[Piece]:
    assert span.end is not None
    out: list[Piece] = []
    charge = span.restart or span.fail_charge
    opened: dict[str, Event] = {}
    queued: Event | None = None
    requeued: Event | None = None
    for e in span.events:
        if e.kind == ev.LOST:
            out.append(Piece(_silent_since(span.events, e), e.t, DETECTION, Charge(e.host, "lost")))
        elif e.kind in (ev.FENCE_START, ev.BACKOFF_START, ev.STALL_START):
            opened[e.kind] = e
        elif e.kind in (ev.FENCE_END, ev.BACKOFF_END, ev.STALL_END):
            begin = {ev.FENCE_END: ev.FENCE_START, ev.BACKOFF_END: ev.BACKOFF_START,
                     ev.STALL_END: ev.STALL_START}[e.kind]
            if begin in opened:
                out.append(_overlay(opened.pop(begin), e.t, charge))
        elif e.kind == ev.QUEUED and queued is None:
            queued = e
        elif e.kind == ev.RUNNING and queued is not None:
            out.append(Piece(queued.t, e.t, REQUEUE if requeued is not None else PENDING,
                             Charge(None, "requeued" if requeued is not None else "queued")))
            queued = None
        elif e.kind == ev.REQUEUED:
            requeued = e
        elif e.kind == ev.FIRST_STEP and requeued is not None:
            out.append(Piece(requeued.t, e.t, REQUEUE, Charge(None, requeued.cause or "requeued")))
            requeued = None
    for e in opened.values():
        out.append(_overlay(e, span.end, charge))
    if queued is not None:
        out.append(Piece(queued.t, span.end, PENDING, Charge(None, "queued")))
    if requeued is not None:
        out.append(Piece(requeued.t, span.end, REQUEUE, Charge(None, requeued.cause or "requeued")))
    return out


def _overlay(opened: Event, end: float, charge: Charge) -> Piece:
    if opened.kind == ev.FENCE_START:
        hosts = opened.get("hosts") or [None]
        return Piece(opened.t, end, FENCING, Charge(hosts[0], "lost") if hosts[0] else charge)
    if opened.kind == ev.BACKOFF_START:
        return Piece(opened.t, end, BACKOFF, charge)
    return Piece(opened.t, end, NO_PROGRESS, Charge(opened.host, opened.cause or "no progress"))


def _sweep(pieces: Sequence[Piece], start: float, end: float) -> list[tuple[float, float, Piece]]:
    """Every instant of [start, end] given to the covering piece of highest precedence (the first
    of equals); what no piece covers is OTHER."""
    cuts = sorted({start, end, *(min(max(t, start), end) for p in pieces for t in (p.start, p.end))})
    out: list[tuple[float, float, Piece]] = []
    for a, b in itertools.pairwise(cuts):
        if b <= a:
            continue
        mid = (a + b) / 2
        best: Piece | None = None
        for p in pieces:
            if p.start <= mid < p.end and (best is None or PRECEDENCE.get(p.kind, 0) > PRECEDENCE.get(best.kind, 0)):
                best = p
        out.append((a, b, best or Piece(a, b, OTHER, Charge(None, "not told"))))
    return out


def _productive_between(segments: Sequence[tuple[float, float, Piece]], a: float, b: float) -> float:
    return sum(max(0.0, min(y, b) - max(x, a)) for x, y, p in segments if p.kind == PRODUCTIVE)


def _redone(events: Sequence[Event], attempts: Sequence[AttemptSpan], segments: Sequence[tuple[float, float, Piece]],
            known: bool) -> tuple[Redone, dict[tuple[str, Charge], float]]:
    """The productive time after the last checkpoint before each failure that was run again
    (a restart or a requeue), moved to re-done; unknown without checkpoints to see."""
    failures = [(span.fail_at if span.fail_at is not None else span.end, span.restart, span)
                for span in attempts if span.restart is not None]
    failures += [(e.t, Charge(None, e.cause or "requeued"), span)
                 for span in attempts for e in span.events if e.kind == ev.REQUEUED]
    if not failures:
        return Redone(known), {}
    if not known:
        return Redone(False), {}
    checkpoints = [e for e in events if e.kind == ev.CHECKPOINT]
    moved: dict[tuple[str, Charge], float] = {}
    seconds, steps, since = 0.0, 0, None
    covered = events[0].t
    for at, charge, span in sorted(failures, key=lambda f: f[0] or 0.0):
        assert at is not None and charge is not None
        before = [c for c in checkpoints if c.t <= at]
        from_t = max(before[-1].t if before else events[0].t, covered)
        lost = _productive_between(segments, from_t, at)
        covered = at
        if lost > 0:
            key = (REDONE, charge)
            moved[key] = moved.get(key, 0.0) + lost
            seconds += lost
        at_fail = _step_at(span.events, span.end if span.restart is charge and span.end is not None else at)
        from_step = None  # a checkpoint of an earlier attempt: this one's steps count from 0
        if before and before[-1].attempt == span.number:
            from_step = before[-1].step if before[-1].step is not None else _step_at(span.events, before[-1].t)
        if at_fail is not None:
            steps += max(at_fail - (from_step or 0), 0)
        since = from_step if before else 0
    if len(failures) > 1:
        since = None  # one step would not say where each of them resumed
    return Redone(True, seconds, steps, since), moved


def _step_at(events: Sequence[Event], t: float) -> int | None:
    """The most steps the attempt had reported by `t`."""
    best: int | None = None
    for e in events:
        if e.t <= t and e.step is not None and e.kind in (ev.FIRST_STEP, ev.PROGRESS, ev.CHECKPOINT, ev.ATTEMPT_END):
            best = e.step if best is None else max(best, e.step)
    return best


def _straggled(events: Sequence[Event], attempts: Sequence[AttemptSpan],
               segments: Sequence[tuple[float, float, Piece]]) -> dict[tuple[str, Charge], float]:
    """While a straggler finding was open, the others waited its extra time each step: the
    share slower / (1 + slower) of the productive time in its window, charged to its host."""
    ends = {span.number: span.end for span in attempts}
    out: dict[tuple[str, Charge], float] = {}
    for e in events:
        if e.kind != ev.STRAGGLER:
            continue
        slower = e.get("slower")
        if not isinstance(slower, (int, float)) or slower <= 0:
            continue
        until = e.get("end")
        end = float(until) if isinstance(until, (int, float)) else (ends.get(e.attempt or 0) or e.t)
        share = _productive_between(segments, e.t, end) * slower / (1 + slower)
        if share > 0:
            key = (STRAGGLER, Charge(e.host, "straggler"))
            out[key] = out.get(key, 0.0) + share
    return out
