"""`ps`, `down`, `logs`, `stacks` and `top` behind one interface, `JobControl`: a job on its hosts
over SSH (`HostJobs`) or a Slurm job through Slurm's client (`SlurmJobs`), chosen once by
`job_control`. Each operation returns a typed result for the command to render."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from inventory import Inventory
from inventory.specs import SlurmSpec
from orchestrator.errors import HostError
from orchestrator.hostops import slurm_jobs
from orchestrator.hostops.jobs import JobAbsent, LogSink, down_absent, job_logs, logs_absent, running_jobs, stop_job
from orchestrator.hostops.runrecord import find_record
from orchestrator.hostops.stacks import StacksReport, collect, stacks_absent
from orchestrator.hostops.targets import BackendName, hosts_target, require_job_file, slurm_side
from orchestrator.hostops.top import TopReport, TopSession, collect_slurm
from orchestrator.remote.pool import HostPool, make_pool
from orchestrator.remote.slurm_client import ACTIVE_STATES, QueuedJob, SlurmClient, slurm_client
from orchestrator.remote.ssh_options import Connection
from orchestrator.remote.wire import LogLine, RunningJob, StoppedJob

Sample = Callable[[], TopReport]


@dataclass(frozen=True)
class Listing:
    """`ps`: the jobs running on each host that answered, the hosts that did not, and Slurm's
    queue where it was asked."""

    jobs: list[RunningJob] = field(default_factory=list)
    failed: dict[str, HostError] = field(default_factory=dict)
    queued: list[QueuedJob] | None = None  # ddpctl's jobs in Slurm's queue; None: not asked
    queue_error: HostError | None = None  # Slurm's queue was asked, and could not be read
    queue_only: bool = False  # only Slurm's queue was asked (--backend slurm)


@dataclass(frozen=True)
class Stopped:
    """`down` on the hosts: what each host stopped, the hosts that failed, or the job found nowhere."""

    stopped: dict[str, list[StoppedJob]]
    failed: dict[str, HostError]
    absent: JobAbsent | None


@dataclass(frozen=True)
class Cancelled:
    """`down` of a Slurm job: scancel'ed, and every process of it ended."""

    slurm_id: str
    job_id: str
    state: str


@dataclass(frozen=True)
class Replayed:
    """`logs`: whether any host had the job's log, the hosts that failed, or the job found nowhere."""

    found: bool
    failed: dict[str, HostError] = field(default_factory=dict)
    absent: JobAbsent | None = None


class JobControl(Protocol):
    """What `ps`, `down`, `logs`, `stacks` and `top` do, wherever the job runs."""

    def ps(self, only: str | None) -> Listing:
        """The ddpctl jobs running (only `only`, a job id or name, where given)."""

    def down(self, grace: float) -> Stopped | Cancelled:
        """Stop the job: SIGTERM, then SIGKILL after `grace` (Slurm: scancel)."""

    def logs(self, follow: bool, sink: LogSink) -> Replayed:
        """Replay the job's output into `sink`; with follow, until the job ends."""

    def stacks(self) -> StacksReport:
        """Every rank's Python stack, collapsed; `absent` set where no host runs a rank of it."""

    def top(self, interval: float) -> Sample:
        """A sampler of the job's hosts (every ddpctl job's, where none is named)."""

    def top_absent(self, report: TopReport) -> JobAbsent | None:
        """The job named runs on no host that answered `top`."""


@dataclass
class HostJobs:
    """A job on the hosts of an inventory, through each host's node agent over SSH."""

    pool: HostPool
    inventory: Inventory
    name: str | None  # None: every ddpctl job
    ask_queue: bool = False  # `ps` also lists Slurm's queue where Slurm's client is configured here
    login: str | None = None  # where Slurm's commands run for that

    def job(self) -> str:
        if self.name is None:
            raise ValueError("this operation needs a job")
        return self.name

    def ps(self, only: str | None) -> Listing:
        fan = running_jobs(self.pool, self.inventory.hosts, only)
        jobs = [j for h in self.inventory.names() if h in fan.succeeded for j in fan.succeeded[h]]
        if not (self.ask_queue and slurm_jobs.configured_here()):
            return Listing(jobs, fan.failed)
        try:
            queued = slurm_jobs.ddpctl_jobs(slurm_client(self.pool, self.login, self.inventory))
        except HostError as err:
            return Listing(jobs, fan.failed, None, err)
        return Listing(jobs, fan.failed, [j for j in queued if in_queue_as(j, only)])

    def down(self, grace: float) -> Stopped:
        fan = stop_job(self.pool, self.inventory.hosts, self.job(), grace)
        return Stopped(fan.succeeded, fan.failed, down_absent(self.job(), self.inventory, fan))

    def logs(self, follow: bool, sink: LogSink) -> Replayed:
        fan = job_logs(self.pool, self.inventory.hosts, self.job(), follow, sink)
        found = any(logs.found for logs in fan.succeeded.values())
        return Replayed(found, fan.failed, logs_absent(self.job(), self.inventory, fan))

    def stacks(self) -> StacksReport:
        report = collect(self.pool, self.inventory.hosts, self.job())
        report.absent = stacks_absent(report, self.inventory)
        return report

    def top(self, interval: float) -> Sample:
        return TopSession(self.pool, self.inventory.hosts, self.name, interval).sample

    def top_absent(self, report: TopReport) -> JobAbsent | None:
        answered = tuple(h.name for h in self.inventory.hosts if h.name not in report.failed)
        if report.job is None or report.running or not answered:
            return None
        return JobAbsent(report.job, "it running", answered, len(self.inventory.hosts), self.inventory.source)


@dataclass
class SlurmJobs:
    """A Slurm job (or every ddpctl job in Slurm's queue) through Slurm's client commands."""

    client: SlurmClient
    spec: SlurmSpec
    name: str | None  # a Slurm job id, a ddpctl job id or a job name; None: every ddpctl job in the queue

    def target(self) -> slurm_jobs.SlurmTarget:
        found = slurm_jobs.find(self.client, self.name or "")
        if found is None:
            raise slurm_jobs.not_found(self.client, self.name or "")
        return found

    def ps(self, only: str | None) -> Listing:
        queued = slurm_jobs.ddpctl_jobs(self.client)
        return Listing(queued=[j for j in queued if in_queue_as(j, only)], queue_only=True)

    def down(self, grace: float) -> Cancelled:
        found = self.target()
        if found.slurm_id is None or found.state not in ACTIVE_STATES:
            raise slurm_jobs.not_found(self.client, f"{found.job_id} running")
        return Cancelled(found.slurm_id, found.job_id, slurm_jobs.cancel(self.client, found))

    def logs(self, follow: bool, sink: LogSink) -> Replayed:
        def one_line(node: str, text: str) -> None:  # a node's lines as they come, labelled by node
            sink([LogLine(time.time(), node, None, text)])

        slurm_jobs.logs(self.client, self.target(), follow, one_line)
        return Replayed(True)

    def stacks(self) -> StacksReport:
        return slurm_jobs.stacks(self.client, self.target(), self.spec)

    def top(self, interval: float) -> Sample:
        return lambda: collect_slurm(self.client, self.spec, self.name, interval)

    def top_absent(self, report: TopReport) -> JobAbsent | None:
        return None  # a Slurm job that runs nowhere is an error of its own (slurm_jobs.not_found)


def in_queue_as(job: QueuedJob, only: str | None) -> bool:
    """A queued job is `only` (a Slurm id, a ddpctl job id, or a job name), or there is no `only`."""
    return only is None or only in (job.job_id, job.name) or job.name.startswith(f"{only}-")


@contextmanager
def job_control(connection: Connection, job: str | None, backend: BackendName | None, login: str | None,
                inventory: Path | None, lookup: str | None = None) -> Iterator[JobControl]:
    """The control for the job a command names (None: every ddpctl job; `lookup`: a job id `ps
    --job` filters on): Slurm's for a job.toml with [slurm] (unless backend ssh) or with backend
    slurm, else its hosts'; over one pool. A bare job id with neither -i nor --backend is looked
    up in this machine's run record (runs/<id>/run.json): its hosts, backend and SSH settings."""
    if job is not None:
        require_job_file(job)
    record = find_record(job if job is not None else lookup) if inventory is None and backend is None else None
    if record is not None:
        inventory, connection = record.inventory_path, record.reach.applied_to(connection)
        backend = "slurm" if record.backend == "slurm" else "ssh"
        login = login or record.login
    side = slurm_side(job, backend, login, inventory)
    target = hosts_target(job, inventory) if side is None else None
    with make_pool(connection) as pool:
        if side is not None:
            yield SlurmJobs(slurm_client(pool, side.login, side.inventory), side.spec, side.name)
        else:
            assert target is not None
            yield HostJobs(pool, target.inventory, target.name, ask_queue=backend is None, login=login)

