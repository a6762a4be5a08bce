"""The monitors `ddpctl up` plugs into the supervision core, from its options and the job file."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.launch.monitor_api import Monitor
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import LaunchPlan
from orchestrator.watch.hang import HangTimeout
from orchestrator.watch.job_state import Watch
from orchestrator.watch.metrics import LiveSink, MetricsFeed
from orchestrator.watch.progress import ProgressWatch
from orchestrator.watch.rendezvous import RendezvousWatchdog
from orchestrator.watch.report import ReportWriter


def standard_monitors(plan: LaunchPlan, options: LaunchOptions, metrics: LiveSink | None = None) -> Sequence[Monitor]:
    """The rendezvous watchdog (ranks that all run through the wrapper, a join timeout: the flag's,
    else the job file's; 0: none), the hang timeout (--hang-timeout), progress/straggler/stall
    watching ([watch]), the report, and the metrics' feed (`metrics`: `up`'s port; hosts with a
    textfile directory: their straggler flags), in the order they are asked on each tick."""
    monitors: list[Monitor] = []
    join_timeout = options.join_timeout if options.join_timeout is not None else plan.job.rendezvous.join_timeout
    if join_timeout and all(hl.wrapped for hl in plan.hosts):
        monitors.append(RendezvousWatchdog(plan, join_timeout))
    if options.hang_timeout:
        monitors.append(HangTimeout(options.hang_timeout, options.on_hang, options.dump_stacks_on_hang))
    watch = Watch(plan.job.watch)
    monitors += [ProgressWatch(watch, options.on_hang), ReportWriter(plan, watch)]
    if metrics is not None or any(hl.host.metrics_dir for hl in plan.hosts):
        monitors.append(MetricsFeed(plan, watch, metrics))
    return monitors
