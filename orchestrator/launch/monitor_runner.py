"""Carries out what the monitors ask of the supervision core: each call's actions in order, and a
request's answer (stacks, a re-probe) back to the monitor that asked, at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from orchestrator.checks.model import ProbeResults
from orchestrator.hostops.stacks import StacksReport
from orchestrator.launch.monitor_api import (
    Action,
    DumpStacks,
    Fail,
    Flag,
    JobView,
    Monitor,
    MonitorEvent,
    Probed,
    Reprobe,
    Say,
    ShowProgress,
    StacksDumped,
    Stop,
)
from orchestrator.launch.observer import Observer
from orchestrator.launch.record import Record
from orchestrator.launch.result import Finding, RunResult


@dataclass(frozen=True)
class CoreHands:
    """What the core lends its monitors' actions: where notices and findings go, how to stop."""

    observer: Observer
    record: Record
    stop: Callable[[str], None]  # stop the job as failed, saying why (once: the core ignores a second)
    dump_stacks: Callable[[str], StacksReport]
    reprobe: Callable[[], ProbeResults]
    flag: Callable[[str, int, bool], None]  # a host's rank named a straggler, or back to pace


class Monitors:
    """The monitors of one job, called in order on the core's thread."""

    def __init__(self, monitors: Sequence[Monitor], job: JobView, hands: CoreHands) -> None:
        self.monitors = tuple(monitors)
        self.job = job
        self.hands = hands

    def tell(self, event: MonitorEvent) -> None:
        for monitor in self.monitors:
            self._carry_out(monitor, monitor.on_event(event, self.job))

    def tick(self) -> None:
        for monitor in self.monitors:
            self._carry_out(monitor, monitor.on_tick(self.job))

    def finish(self, result: RunResult) -> None:
        """The job is over: only what the monitors say is heard now."""
        for monitor in self.monitors:
            for action in monitor.finish(result):
                if isinstance(action, Say):
                    self.hands.observer.on_notice(action.text)

    def _carry_out(self, monitor: Monitor, actions: Sequence[Action]) -> None:
        hands, record = self.hands, self.hands.record
        for action in actions:
            match action:
                case Say():
                    hands.observer.on_notice(action.text)
                case Finding():
                    record.findings.append(action)
                case ShowProgress():
                    hands.observer.on_progress(action.status)
                case Fail():
                    record.hung = record.hung or action.hung
                    record.cause = record.cause or action.cause  # the first diagnosis stands
                case Stop():
                    hands.stop(action.reason)
                case DumpStacks():
                    dumped = StacksDumped(action.why, hands.dump_stacks(action.why))
                    self._carry_out(monitor, monitor.on_reply(dumped, self.job))
                case Reprobe():
                    self._carry_out(monitor, monitor.on_reply(Probed(hands.reprobe()), self.job))
                case Flag():
                    hands.flag(action.host, action.local_rank, action.straggler)
