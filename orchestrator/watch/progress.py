"""The progress monitor: feeds the core's events to a Watch (orchestrator/watch/job_state.py) and, on
the core's timer, shows the progress, says each finding once and looks into a stall (no rank
stepped for max([watch] hang_after, 5 x the p95 step time)): every rank's flight records and stack
name the collective the job waits in and the rank that never entered it. Reported; the job runs on
unless --on-hang=stop."""

from __future__ import annotations

import time
from collections.abc import Sequence

from orchestrator.hostops.stacks import StacksReport
from orchestrator.launch.events import Milestone, Sampled
from orchestrator.launch.faults import LinkState
from orchestrator.launch.monitor_api import (
    Action,
    DumpStacks,
    Fail,
    HostLost,
    JobView,
    MonitorEvent,
    Quiet,
    Reply,
    Say,
    ShowProgress,
    StacksDumped,
    Stop,
)
from orchestrator.launch.options import OnHang
from orchestrator.launch.result import Finding
from orchestrator.watch.hang import STOP_HUNG
from orchestrator.watch.job_state import Watch


class ProgressWatch(Quiet):
    def __init__(self, watch: Watch, on_hang: OnHang) -> None:
        self.watch = watch
        self.on_hang = on_hang
        self.kept = 0  # how many of the watch's findings the core has been given
        self.stall_quiet_s: float | None = None  # the stall being looked into: seconds without a step

    def on_event(self, event: MonitorEvent, job: JobView) -> Sequence[Action]:
        said: list[Finding] = []
        if isinstance(event, Milestone) and event.phase.step is not None:
            self.watch.on_step(event.host, event.phase)
        elif isinstance(event, Sampled):
            said = self.watch.on_sample(event.host, event.sample)
        elif isinstance(event, HostLost):
            self.watch.host_lost(event.host, event.why)
        return [*self._keep(), *(Say(f.text) for f in said)]

    def on_tick(self, job: JobView) -> Sequence[Action]:
        actions: list[Action] = [Say(text) for text in self.watch.check()]
        status = self.watch.status()
        if status is not None:
            actions.append(ShowProgress(status))
        if not job.stopping and not any(link.state is LinkState.SILENT for link in job.links.values()):
            actions += self._stall()  # a host we cannot hear from sends no steps: not the job's stall
        return [*self._keep(), *actions]

    def _stall(self) -> list[Action]:
        quiet = self.watch.stalled()
        if quiet is None:
            return []
        self.stall_quiet_s = quiet
        return [Say(f"no rank has taken an optimizer step for {quiet:.0f}s (limit {self.watch.stall_limit():.0f}s): "
                    "asking every rank where it is"), DumpStacks("hang")]

    def on_reply(self, reply: Reply, job: JobView) -> Sequence[Action]:
        if not isinstance(reply, StacksDumped) or self.stall_quiet_s is None:
            return ()
        finding = stall_finding(reply.report, self.stall_quiet_s)
        self.stall_quiet_s = None
        self.watch.add(finding)
        actions: list[Action] = [*self._keep(), Say(finding.text)]
        if self.on_hang == "stop":
            actions += [Fail(hung=True), Stop(STOP_HUNG)]
        return actions

    def _keep(self) -> list[Action]:
        """The watch's findings the core does not have yet, in order."""
        new = self.watch.findings[self.kept:]
        self.kept = len(self.watch.findings)
        return list(new)


def stall_finding(report: StacksReport, quiet: float) -> Finding:
    """What the stacks say of a stall: the collective it waits in and who never entered it, else
    where the ranks are busy."""
    verdict = report.verdict
    if verdict is not None and (verdict.missing or verdict.seq is not None):
        return Finding("hang", f"hang: the job waits in {verdict.text}", time.time(),
                       verdict.missing[0] if verdict.missing else None)
    where = report.groups[0].summary() if report.groups else "no stack"
    return Finding("no progress", f"no progress: no optimizer step for {quiet:.0f}s and no collective is pending "
                   f"(the ranks are busy elsewhere: {where})", time.time())
