"""One attempt's part of its run's events.jsonl (orchestrator/account/events.py), told by the
supervision core as the job goes: the launch, every rank's first step, progress now and then, a
host's silence, loss or failure, a checkpoint seen, a stall, a stop, the scheduler's queue and
requeue, the stragglers and the attempt's end."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.account import events as ev
from orchestrator.account.events import EventLog
from orchestrator.launch.plan import ATTEMPT_ENV, LaunchPlan
from orchestrator.launch.result import Finding, RankFailure, RunResult

PROGRESS_EVERY = 5.0  # a `progress` event at most this often (the steps, for re-done work)
HISTORY = 4096  # the newest step records kept to find the step at a checkpoint's time (~30 min at 2 a s)
STALLS = ("hang", "no progress")  # the findings that say no step is being taken


def attempt_of(plan: LaunchPlan) -> int:
    """Which attempt of its run a launch is (0 for a job without restarts)."""
    try:
        return int(plan.job.env.get(ATTEMPT_ENV, "0"))
    except ValueError:
        return 0


class AttemptTimeline:
    """Writes one attempt's events; knows when every rank has stepped and when the last step was."""

    def __init__(self, plan: LaunchPlan, log: EventLog) -> None:
        self.log = log
        self.began = time.time()  # a rank's record from before this (another clock's) is not trusted
        self.attempt = attempt_of(plan)
        self.ranks = plan.world_size
        self.stepped: dict[tuple[str, int | None], float] = {}  # (host, local rank) -> its first step's time
        self.first_step: float | None = None
        self.step = 0  # the most steps of any rank
        self.last_step: float | None = None  # when `step` last grew
        self.said_progress = 0.0
        self.stall_open = False
        self.findings_seen = 0
        self.newest_checkpoint = 0.0  # the newest checkpoint told
        self.history: deque[tuple[float, int]] = deque(maxlen=HISTORY)  # (when, steps), as the ranks recorded them

    def step_at(self, t: float) -> int | None:
        """The most steps taken by time `t` (the ranks' records, interpolated between two)."""
        before = [(at, step) for at, step in self.history if at <= t]
        after = [(at, step) for at, step in self.history if at > t]
        if not before:
            return None
        (t0, s0), then = before[-1], after[0] if after else None
        if then is None or then[0] <= t0:
            return s0
        return s0 + int((then[1] - s0) * (t - t0) / (then[0] - t0))

    def checkpoint(self, host: str, mtime: float, node_steps: int | None) -> None:
        """A newer checkpoint file: its time, and the steps taken by then."""
        if mtime <= self.newest_checkpoint:
            return  # another host of a shared directory told it, or it was told as the job ran
        self.newest_checkpoint = mtime
        step = self.step_at(mtime)
        self.add(ev.CHECKPOINT, mtime, host=host, step=step if step is not None else node_steps, node_steps=node_steps)

    def add(self, kind: str, t: float | None = None, **fields: Any) -> None:
        self.log.add(kind, t, attempt=self.attempt, **fields)

    def launched(self, hosts: Sequence[str]) -> None:
        self.add(ev.LAUNCH, hosts=list(hosts))

    def stepped_to(self, host: str, local_rank: int | None, step: int, at: float | None = None) -> None:
        """A rank's record of its steps (`at`: when it wrote it, its host's clock). It counts from
        then where that time is plausible (since the launch, not ahead of ours): a record that
        comes late, replayed after a cut, must not stretch the productive time over the cut."""
        now = time.time()
        when = at if at is not None and self.began <= at <= now else now
        if at is not None and step > (self.history[-1][1] if self.history else 0):
            self.history.append((at, step))
        if step > 0 and local_rank is not None and (host, local_rank) not in self.stepped:
            self.stepped[(host, local_rank)] = when
            if self.first_step is None and len(self.stepped) >= self.ranks:
                self.first_step = max(self.stepped.values())
                self.add(ev.FIRST_STEP, self.first_step, step=step)
        if step <= self.step:
            return
        self.step, self.last_step = step, max(when, self.last_step or when)
        if self.stall_open:
            self.stall_open = False
            self.add(ev.STALL_END, when, step=step)
        if self.first_step is not None and when - self.said_progress >= PROGRESS_EVERY:
            self.said_progress = when
            self.add(ev.PROGRESS, when, step=step)

    def failed_first(self, root: RankFailure) -> None:
        """The rank that failed first, learned after another host's failure was told (its records
        replayed once its host was reached again after a cut): its own failure at its own time, the
        earliest, which the account charges, as it would have without the cut."""
        now, at = time.time(), root.error.timestamp
        when = at if at is not None and self.began <= at <= now else now
        self.add(ev.FAILED, when, host=root.host, cause="failed", why=f"{root.error.kind or 'an error'} of its own")

    def requeued(self, text: str) -> None:
        """The scheduler requeued the job: its ranks start again (their first step is told anew)."""
        self.add(ev.REQUEUED, cause="requeued", text=text)
        self.stepped.clear()
        self.first_step = None
        self.step = 0
        self.history.clear()

    def findings(self, findings: Sequence[Finding], host_of: Callable[[int], str | None]) -> None:
        """New findings on the core's timer: a stall opens at the last step, charged to the host of
        the rank it names (`host_of`: a global rank's host), if any."""
        for finding in findings[self.findings_seen:]:
            if finding.kind in STALLS and not self.stall_open:
                self.stall_open = True
                host = finding.host or (host_of(finding.rank) if finding.rank is not None else None)
                self.add(ev.STALL_START, self.last_step or finding.at, host=host, cause=finding.kind,
                         rank=finding.rank, step=self.step)
        self.findings_seen = len(findings)

    def ended(self, result: RunResult, outcome: str) -> None:
        """The attempt is over: its stragglers (their spans) and its end."""
        if self.first_step is None and self.stepped:  # not every rank said: the first that did
            self.first_step = min(self.stepped.values())
            self.add(ev.FIRST_STEP, self.first_step, step=1, ranks=len(self.stepped))
        for finding in result.findings:
            if finding.kind == "straggler" and finding.span is not None:
                self.add(ev.STRAGGLER, finding.span.start, host=finding.host, rank=finding.rank,
                         end=finding.span.end, slower=finding.slower)
        self.add(ev.ATTEMPT_END, exit_code=result.exit_code, outcome=outcome, step=result.steps,
                 last_step=self.last_step)


def outcome_of(result: RunResult) -> str:
    """ok, stopped (by someone: a signal, `ddpctl down`, the scheduler) or failed."""
    if result.ok:
        return "ok"
    if result.signal is not None or result.interrupted or result.stopped_by is not None or \
            (result.ended_by is not None and result.loss is None):
        return "stopped"
    return "failed"
