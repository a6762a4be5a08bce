"""The backend seam: what turns a plan into running processes and back into events.

The SSH backend runs one supervised torchrun per host over its own connection; a batch backend
(Slurm) submits one job and streams its output. The contract assumes neither: a backend resolves
what the plan needs, starts every node, reports `BackendEvent`s for each node from any thread
until every node has `Exited` or is `Lost`, and stops nodes when asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from inventory import Host, Job
from node_agent.wire.requests import SuperviseRequest
from orchestrator.checks.model import ProbeResults
from orchestrator.errors import HostError
from orchestrator.hostops.stacks import StacksReport
from orchestrator.launch.events import BackendEvent
from orchestrator.launch.faults import limits_for
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import HostLaunch, LaunchPlan
from orchestrator.sync.core import Progress, SyncReport

Emit = Callable[[BackendEvent], None]

Notice = Callable[[str], None]



@dataclass(frozen=True)
class Resolved:
    """What the plan needs from the hosts: processes per node and the master port."""

    nprocs: dict[str, int]
    master_port: int
    hosts: tuple[Host, ...] | None = None  # the nodes, where the backend names them (Slurm's)
    master_addr: str | None = None  # settled from the hosts' routes (None: the job's own)
    env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # host -> variables ddpctl sets
    local_addrs: Mapping[str, str] = field(default_factory=dict)  # host -> its own address, as it reported it


@dataclass(frozen=True)
class Fenced:
    """A host lost during a job, reached again: what it still ran of the job, ended now."""

    host: str
    ended: int  # processes of the job that were still running there (SIGTERM, then SIGKILL)
    left: tuple[int, ...] = ()  # pids still alive after SIGKILL: not fenced

    @property
    def confirmed(self) -> bool:
        return not self.left


@dataclass
class DetachReport:
    """Nodes started as daemons, and the ones that could not be started."""

    started: dict[str, int | None] = field(default_factory=dict)  # host -> its supervisor's pid
    failed: dict[str, HostError] = field(default_factory=dict)
    slurm_job_id: str | None = None  # the batch job, where the backend is Slurm


def supervise_request(plan: LaunchPlan, launch: HostLaunch, options: LaunchOptions,
                      detach: bool) -> SuperviseRequest:
    """What a node's supervisor (node_agent/runtime/supervisor.py) is asked to run."""
    return SuperviseRequest(
        job_id=plan.job_id, job_name=plan.job.name, run_id=plan.run_id or "", node_rank=launch.node_rank,
        launcher=tuple(launch.launcher), program=tuple(launch.program), modules=tuple(launch.modules),
        env=dict(launch.env), cwd=launch.cwd,
        grace=options.grace,
        heartbeat_timeout=0 if detach else limits_for(plan.job.lost_after, options.lost_after).node_after,
        detach=detach, nccl_debug=options.nccl_debug, wrap=launch.wrapped, sample_every=plan.job.watch.sample_every,
        metrics_dir=launch.host.metrics_dir or "", metrics_every=plan.job.metrics.every,
        metrics_keep=plan.job.metrics.keep_ended)


class Backend(Protocol):
    name: str

    def sync(self, job: Job, options: LaunchOptions, progress: Progress) -> SyncReport | None:
        """Copy the job's source ([sync]) to every node before anything else (never the runs
        directory); None: the backend's nodes see this machine's files already."""

    def resolve(self, job: Job, options: LaunchOptions, notice: Notice, settle: bool) -> Resolved:
        """nproc per node and the master port. `settle` False (dry run): look, never change a host."""

    def start(self, plan: LaunchPlan, options: LaunchOptions, emit: Emit) -> None:
        """Start every node of the plan and return at once; events follow through `emit`."""

    def stop(self, hosts: Sequence[str], force: bool, failed: bool = False) -> None:
        """Ask these nodes to stop: gracefully (SIGTERM, then SIGKILL after the grace), or now.
        `failed`: the job has failed already, so only the ranks get the grace, never torchrun."""

    def flag(self, host: str, local_rank: int, straggler: bool) -> None:
        """Tell a node that one of its ranks is named a straggler, or is back to pace (its metrics
        textfile says so); a backend without a channel to its nodes does nothing."""

    def drop(self, host: str) -> None:
        """Give up on a node (lost): close what connects us to it; it ends its part on its own."""

    def reattach(self, host: str) -> None:
        """The node has gone silent: try to reach it again (in the background) and resume its
        events where they stopped (`Reattached`); a backend that cannot lose a node does nothing."""

    def close(self) -> None:
        """The job is over: stop background work (heartbeats, pollers)."""

    def fence(self, host: Host, job_id: str, grace: float) -> Fenced:
        """End what a host lost during job `job_id` may still run of it, on a fresh connection
        (SIGTERM, then SIGKILL after `grace`). Raises HostError while the host cannot be reached."""

    def detach(self, plan: LaunchPlan, options: LaunchOptions) -> DetachReport:
        """Start every node to run on without us; `ddpctl ps/logs/down` take over."""

    def stacks(self, plan: LaunchPlan) -> StacksReport:
        """Every rank's Python stack (for hangs and --dump-on-interrupt)."""

    def reprobe(self, plan: LaunchPlan) -> ProbeResults:
        """doctor's TCP probe, now, while the job waits at its rendezvous: every node dials the
        master port (held by the job's store) and every other node; a node that cannot be asked
        is in `errors`."""
