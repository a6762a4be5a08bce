"""The rendezvous watchdog: knows, from the ranks' milestones, whether the ranks have all met, and
when they have not within the bound, re-probes the network as doctor does, says why in doctor's
words and stops the job (the diagnosis is the run's headline).

Two rendezvous can hang. torchrun's own, between the nodes, ends when the ranks start (their
wrapper's `started`); it is overdue `timeout` seconds after torchrun runs on every node.
init_process_group's, between the ranks, ends when every rank has `joined`; it is overdue only
once every rank has entered it (a rank still loading data before its init is not a hang) and
`timeout` seconds have passed since the last one did. A job whose ranks never call
init_process_group is never judged by the second. A node whose torchrun never starts at all
(a batch task that never ran) makes the first overdue `timeout` seconds after the first node's
started.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from orchestrator.checks.context import from_job
from orchestrator.checks.firewall import probe_findings
from orchestrator.checks.model import Observations, ProbeResults
from orchestrator.checks.render import finding_text
from orchestrator.launch.events import Milestone, Started
from orchestrator.launch.monitor_api import (
    Action,
    Fail,
    JobView,
    MonitorEvent,
    Probed,
    Quiet,
    Reply,
    Reprobe,
    Say,
    Stop,
)
from orchestrator.launch.plan import LaunchPlan
from orchestrator.remote.wire import RankPhase

STARTED = ("started", "init", "joined")
ENTERED = ("init", "joined")
TAIL_LINES = 5


class RendezvousWatch:
    """The milestones of one job's ranks, and whether their rendezvous is overdue."""

    def __init__(self, plan: LaunchPlan, timeout: float) -> None:
        self.plan = plan
        self.timeout = timeout
        self.nproc = {hl.host.name: hl.nproc for hl in plan.hosts}
        self.host_started: dict[str, float] = {}  # host -> when its torchrun started (monotonic)
        self.phases: dict[tuple[str, int], set[str]] = {}  # (host, local rank) -> its milestones
        self.last_entry: float | None = None  # when the latest rank entered init_process_group
        self.done = False

    def started(self, host: str) -> None:
        self.host_started[host] = time.monotonic()

    def saw(self, host: str, phase: RankPhase) -> None:
        if phase.local_rank is None:
            return
        self.phases.setdefault((host, phase.local_rank), set()).add(phase.phase)
        if phase.phase == "init":
            self.last_entry = time.monotonic()

    def count(self, phases: Sequence[str], host: str | None = None) -> int:
        return sum(1 for (h, _), seen in self.phases.items()
                   if (host is None or h == host) and seen.intersection(phases))

    @property
    def world(self) -> int:
        return sum(self.nproc.values())

    @property
    def between_nodes(self) -> bool:
        """Still in torchrun's rendezvous: not every rank has started."""
        return self.count(STARTED) < self.world

    def overdue(self, now: float) -> bool:
        if self.done or not self.host_started:
            return False
        if len(self.host_started) < len(self.nproc):  # a node whose torchrun never started at all
            return now - min(self.host_started.values()) > self.timeout
        if self.count(("joined",)) >= self.world:
            self.done = True
            return False
        if self.between_nodes:
            return now - max(self.host_started.values()) > self.timeout
        if self.count(ENTERED) < self.world:
            return False
        return self.last_entry is not None and now - self.last_entry > self.timeout

    def waiting(self) -> dict[str, str]:
        """host -> how far its ranks got, for each host whose ranks have not all met."""
        out = {}
        for host, n in self.nproc.items():
            if host not in self.host_started:
                out[host] = "its torchrun never started"
            elif self.between_nodes:
                started = self.count(STARTED, host)
                if started < n:
                    out[host] = f"{started} of {n} rank(s) started"
            else:
                joined = self.count(("joined",), host)
                if joined < n:
                    out[host] = f"{joined} of {n} rank(s) returned from init_process_group"
        return out

    def diagnose(self, probes: ProbeResults, tails: Mapping[str, Sequence[str]]) -> str:
        """The cause, in doctor's words where the re-probe found one, then what the hosts that never
        joined last printed."""
        plan = self.plan
        where = next((f"{o.address}:{o.port}" for o in probes.outcomes if o.purpose == "master_port"),
                     f"{plan.master_addr}:{plan.master_port}")  # a Slurm job's is only known on its nodes
        stage = (f"torchrun's rendezvous at {where}" if self.between_nodes
                 else "init_process_group (the process group's rendezvous between the ranks)")
        waiting = self.waiting()
        lines = [f"the ranks did not all join within {self.timeout:.0f}s: {stage} never completed"]
        lines += [f"  {host}: {how}" for host, how in waiting.items()]
        ctx = from_job(plan.job, master_port=plan.master_port, master_addr=plan.master_addr)
        findings = probe_findings(Observations(ctx, {}, {}, probes))
        if findings:
            lines.append("re-probe of the master port and the ports between the hosts (as ddpctl doctor does):")
            lines += ["  " + line for f in findings for line in finding_text(f).plain.splitlines()]
        elif probes.outcomes:
            lines.append(f"the master port {where} and the ports between the hosts answer from every host, so "
                         "the block is elsewhere (hostnames, NCCL/GLOO_SOCKET_IFNAME): run "
                         f"`ddpctl doctor {plan.job.source or 'JOB_FILE'}`")
        lines += [f"  {host}: could not re-probe: {why}" for host, why in probes.errors.items()]
        for host in waiting:
            tail = [line for line in tails.get(host, []) if line.strip()][-TAIL_LINES:]
            lines.append(f"{host} last printed:" if tail else f"{host} printed nothing")
            lines += [f"    {line}" for line in tail]
        return "\n".join(lines)


class RendezvousWatchdog(Quiet):
    """The watchdog as a supervision monitor: milestones in; once overdue, a re-probe, then the
    diagnosis and a stop."""

    def __init__(self, plan: LaunchPlan, timeout: float) -> None:
        self.rendezvous = RendezvousWatch(plan, timeout)
        self.asked = False

    def on_event(self, event: MonitorEvent, job: JobView) -> Sequence[Action]:
        if isinstance(event, Started):
            self.rendezvous.started(event.host)
        elif isinstance(event, Milestone):
            self.rendezvous.saw(event.host, event.phase)
        return ()

    def on_tick(self, job: JobView) -> Sequence[Action]:
        if self.asked or job.stopping or not self.rendezvous.overdue(time.monotonic()):
            return ()
        self.asked = True
        return [Say(f"the ranks have not all joined {self.rendezvous.timeout:.0f}s after torchrun started on "
                    "every host: re-probing the master port and the ports between the hosts"), Reprobe()]

    def on_reply(self, reply: Reply, job: JobView) -> Sequence[Action]:
        if not isinstance(reply, Probed):
            return ()
        cause = self.rendezvous.diagnose(reply.probes, {name: run.tail for name, run in job.runs.items()})
        return [Fail(cause=cause), Stop("the rendezvous will not complete: stopping the job on every host (the "
                                        "cause is in the summary)")]
