"""The hang timeout (--hang-timeout, --on-hang, --dump-stacks-on-hang): no rank printed anything for
that long, so the job looks hung: said once, every rank's stack dumped, the job stopped with
--on-hang=stop. Either way the run fails."""

from __future__ import annotations

import time
from collections.abc import Sequence

from orchestrator.launch.events import Output
from orchestrator.launch.monitor_api import Action, DumpStacks, Fail, JobView, MonitorEvent, Quiet, Say, Stop
from orchestrator.launch.options import OnHang

STOP_HUNG = "stopping the hung job on every host (--on-hang=stop)"


class HangTimeout(Quiet):
    def __init__(self, timeout: float, on_hang: OnHang, dump_stacks: bool) -> None:
        self.timeout = timeout
        self.on_hang = on_hang
        self.dump_stacks = dump_stacks
        self.last_output = time.monotonic()
        self.fired = False

    def on_event(self, event: MonitorEvent, job: JobView) -> Sequence[Action]:
        if isinstance(event, Output):
            self.last_output = time.monotonic()
        return ()

    def on_tick(self, job: JobView) -> Sequence[Action]:
        if self.fired or job.stopping or time.monotonic() - self.last_output < self.timeout:
            return ()
        self.fired = True
        actions: list[Action] = [Fail(hung=True),
                                 Say(f"no rank printed anything for {self.timeout:.0f}s: the job looks hung")]
        if self.dump_stacks:
            actions.append(DumpStacks("hang"))
        if self.on_hang == "stop":
            actions.append(Stop(STOP_HUNG))
        return actions
