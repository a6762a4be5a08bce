"""`up`'s metrics feed: the monitor that keeps the live part of `up --metrics-port`'s series (steps,
the last step, stragglers, lost hosts; orchestrator/watch/run_metrics.py serves them) and tells each
host with a textfile which of its ranks is a straggler (its ddpctl_rank_straggler). It imports no
prometheus-client: the CLI loads it on every command."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from orchestrator.launch.monitor_api import Action, Flag, HostLost, JobView, MonitorEvent, Quiet
from orchestrator.launch.plan import LaunchPlan
from orchestrator.launch.result import RunResult
from orchestrator.watch.job_state import Watch


@dataclass
class Live:
    """What the monitor of the current attempt knows now (the account knows the rest)."""

    steps: int | None = None
    last_step: float | None = None  # time.time()
    stragglers: dict[tuple[str, int], int | None] = field(default_factory=dict)  # (host, local rank) -> rank
    lost: set[str] = field(default_factory=set)


class LiveSink(Protocol):
    """Where the feed puts what it knows (RunMetrics)."""

    def update(self, live: Live) -> None: ...


class MetricsFeed(Quiet):
    """Keeps RunMetrics' live part (steps, the last step, stragglers, lost hosts) from the attempt's
    Watch, and tells a host with a metrics textfile when one of its ranks is named a straggler or is
    back to pace (Flag)."""

    def __init__(self, plan: LaunchPlan, watch: Watch, metrics: LiveSink | None) -> None:
        self.watch = watch
        self.metrics = metrics
        self.textfiles = {hl.host.name for hl in plan.hosts if hl.host.metrics_dir}
        self.flagged: set[tuple[str, int]] = set()
        self.lost: set[str] = set()

    def on_event(self, event: MonitorEvent, job: JobView) -> Sequence[Action]:
        if isinstance(event, HostLost):
            self.lost.add(event.host)
        return ()

    def on_tick(self, job: JobView) -> Sequence[Action]:
        watch = self.watch
        now = set(watch.episodes)
        actions: list[Action] = [Flag(host, local, True) for host, local in sorted(now - self.flagged)
                                 if host in self.textfiles]
        actions += [Flag(host, local, False) for host, local in sorted(self.flagged - now) if host in self.textfiles]
        self.flagged = now
        self._update({key: watch.ranks[key].rank if key in watch.ranks else None for key in now})
        return actions

    def finish(self, result: RunResult) -> Sequence[Action]:
        """The attempt is over: no rank is a straggler any more."""
        self._update({})
        return ()

    def _update(self, stragglers: dict[tuple[str, int], int | None]) -> None:
        if self.metrics is not None:
            watch = self.watch
            last = watch.last_step_at + watch.wall_offset if watch.last_step_at is not None else None
            self.metrics.update(Live(watch.step, last, stragglers, set(self.lost)))
