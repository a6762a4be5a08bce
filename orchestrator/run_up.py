"""`run_up`: what `ddpctl up` and `orchestrator.up()` do with a job, in one place: a dry run, a
detached start (with its restart loop, where restarts are asked for), restarts, or one launch."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from inventory import ConfigError, Job
from orchestrator.account import events as ev
from orchestrator.hostops.runrecord import Reach, new_record, write_record
from orchestrator.launch import core
from orchestrator.launch.backends.base import Backend
from orchestrator.launch.backends.choose import backend_for
from orchestrator.launch.backends.slurm import SlurmBackend
from orchestrator.launch.monitor_api import MonitorFactory
from orchestrator.launch.observer import Observer
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import LaunchPlan, new_job_id
from orchestrator.launch.result import RunResult
from orchestrator.launch.timeline import outcome_of
from orchestrator.remote.pool import HostPool, make_pool
from orchestrator.remote.ssh_options import Connection
from orchestrator.restarts import detached as detached_restarts
from orchestrator.restarts import hostledger
from orchestrator.restarts import loop as restarts
from orchestrator.watch.factory import standard_monitors
from orchestrator.watch.run_account import add_to_files, close_run, open_run

if TYPE_CHECKING:
    from orchestrator.watch.run_metrics import RunMetrics


@dataclass(frozen=True)
class UpRequest:
    """Everything `up` was asked besides the job: how to launch, how to reach the hosts, and what
    to do (a dry run, a detached start, how many restarts)."""

    options: LaunchOptions = field(default_factory=LaunchOptions)
    connection: Connection = field(default_factory=Connection)
    dry_run: bool = False
    detach: bool = False
    max_restarts: int | None = None  # None: the job file's [restart] max_restarts
    run_id: str | None = None  # the run's id (a detached run's restart loop is given it)
    argv: tuple[str, ...] = ()  # `ddpctl up` as typed: what a detached run's restart loop runs again

    def restart_budget(self, job: Job) -> int:
        return job.restart.max_restarts if self.max_restarts is None else self.max_restarts

    @property
    def attached(self) -> bool:
        """`up` stays with the job to its end (it runs: neither a dry run nor detached)."""
        return not self.dry_run and not self.detach


@dataclass(frozen=True)
class BatchScript:
    """A Slurm dry run: the sbatch command, the batch script, and the (masked) env every node's
    supervisor reads from its 0600 request file."""

    where: str
    argv: list[str]
    script: str
    env: dict[str, str]


@dataclass(frozen=True)
class DryRun:
    """What would run on each host; nothing was started."""

    plan: LaunchPlan
    batch: BatchScript | None  # None: the SSH backend's per-host commands are the whole story
    checks: bool  # a launch would run the pre-launch checks (which a dry run does not)


@dataclass(frozen=True)
class Finished:
    """One launch, run to its end."""

    result: RunResult


@dataclass(frozen=True)
class Restarted:
    """A run with restarts, to its end: each attempt, the hosts left out, why it stopped."""

    run: restarts.RestartedRun


Detached = core.Detached  # started to run on without us
LoopStarted = detached_restarts.LoopStarted  # a detached run's restart loop, started on its first host
UpOutcome = DryRun | Detached | LoopStarted | Finished | Restarted


def check_restartable(job: Job, request: UpRequest) -> None:
    """A detached job's restarts run from its first host, over SSH: on Slurm they are refused
    before anything starts."""
    if request.restart_budget(job) > 0 and request.detach and job.slurm is not None:
        raise ConfigError("--detach with restarts on Slurm: the restarting loop would need a host of its own",
                          key="--detach", hint="run `up` attached (on the login node, in tmux or screen), or use "
                          "[slurm] requeue = true, which Slurm carries out itself")


def run_up(job: Job, request: UpRequest, observer: Observer) -> UpOutcome:
    """Do what `request` asks with `job`, reporting progress to `observer`; bad input raises
    ConfigError, a blocked launch LaunchBlocked (ChecksFailed: the pre-launch findings)."""
    check_restartable(job, request)
    request = replace(request, options=replace(request.options, reach=Reach.of(request.connection)))
    with make_pool(request.connection) as pool:
        runner = backend_for(pool, job)
        if request.dry_run:
            return dry_run(job, runner, request.options)
        if not isinstance(runner, SlurmBackend):
            pool.connect_ahead(job.hosts)  # the handshakes run while the launch is planned
        if request.detach:
            return detach(job, pool, runner, request, observer)
        return launch(job, pool, runner, request, observer)


def dry_run(job: Job, runner: Backend, options: LaunchOptions) -> DryRun:
    plan = core.plan_job(job, runner, options)
    if isinstance(runner, SlurmBackend):
        argv, script, env = runner.dry_run(plan)
        return DryRun(plan, BatchScript(runner.client.where, argv, script, env), options.checks)
    return DryRun(plan, None, options.checks)


def detach(job: Job, pool: HostPool, runner: Backend, request: UpRequest,
           observer: Observer) -> Detached | LoopStarted:
    if job.metrics.port is not None:
        observer.on_notice(f"warning: metrics port {job.metrics.port} is not served: a detached run has no `up` "
                           "to serve it (the hosts' textfiles are written all the same)")
    if request.restart_budget(job) > 0:
        loop = detached_restarts.start_loop(job, pool, request.argv, Path.cwd())
        write_record(request.options.runs_dir, new_record(
            loop.run_id, job.name, [h.name for h in job.hosts], job.inventory.source, job.source, runner.name, None,
            request.options.reach, detached=True))
        return loop
    job = screened(job, observer)
    done = core.detach(job, runner, observer, request.options)
    for warning in hostledger.record_start(job, done.plan.job_id):
        observer.on_notice(f"warning: {warning}")
    return done


def launch(job: Job, pool: HostPool, runner: Backend, request: UpRequest,
           observer: Observer) -> Finished | Restarted:
    with served_metrics(job, observer) as metrics:
        monitors = functools.partial(standard_monitors, metrics=metrics)
        budget = request.restart_budget(job)
        if budget > 0:
            return Restarted(restarts.launch(job, lambda attempt: backend_for(pool, attempt), observer,
                                             request.options, budget, request.run_id, monitors=monitors,
                                             events_to=metrics.attach if metrics is not None else None))
        return Finished(launch_once(job, runner, request, observer, monitors, metrics))


@contextlib.contextmanager
def served_metrics(job: Job, observer: Observer) -> Iterator[RunMetrics | None]:
    """The run's series on [metrics] port (--metrics-port) while it runs: a port that cannot be
    served is a ConfigError before anything starts. After the run, Prometheus is given its next
    scrape of the final values (at most twice its interval)."""
    if job.metrics.port is None:
        yield None
        return
    from orchestrator.watch.run_metrics import MetricsServer, RunMetrics  # prometheus-client: ~0.1 s to import

    server = MetricsServer(RunMetrics(job, job.backend), job.metrics.port)
    try:
        yield server.metrics
    finally:
        server.metrics.ended()
        limit = server.metrics.final_wait()
        if limit:
            observer.on_notice(f"metrics: serving the run's last values to Prometheus' next scrape "
                               f"(at most {limit:.0f} s)")
            with contextlib.suppress(KeyboardInterrupt):
                server.metrics.wait_final_scrape(limit)
        server.close()


def launch_once(job: Job, runner: Backend, request: UpRequest, observer: Observer, monitors: MonitorFactory,
                metrics: RunMetrics | None) -> RunResult:
    job = screened(job, observer)
    job_id = new_job_id(job.name)
    run_dir = request.options.runs_dir / job_id
    events = open_run(run_dir, job_id, job, [h.name for h in job.hosts])
    if metrics is not None:
        metrics.attach(events, job_id)
    events.add(ev.ATTEMPT_START, attempt=0, hosts=[h.name for h in job.hosts])
    result = core.launch(job, runner, observer, request.options, monitors=monitors, job_id=job_id,
                         events=events)
    result.account = close_run(events, result.exit_code, outcome_of(result))
    if result.account is not None:
        add_to_files(result.account, result.run_dir / "summary.json", result.run_dir)
        for warning in hostledger.record_account(job, result.account):
            observer.on_notice(f"warning: {warning}")
    remember(job, result, observer)
    return result


def screened(job: Job, observer: Observer) -> Job:
    """A launch without restarts: the job less its quarantined hosts (unless quarantine is off)."""
    if job.restart.quarantine and job.inventory.quarantine:
        return hostledger.leave_out_quarantined(job, observer.on_notice)
    return job


def remember(job: Job, result: RunResult, observer: Observer) -> None:
    """A plain launch in the host ledger: classified as a restart would be, to find its host faults."""
    verdict = None if result.ok else restarts.classify(result, job, 0, [])
    faults = verdict.faults if verdict is not None and verdict.kind is restarts.Failure.HOST_FAULT else {}
    for warning in hostledger.record_attempt(job, result, restarts.lost_hosts(result), faults):
        observer.on_notice(f"warning: {warning}")

