"""The launch pipeline's one home: plan a job, resolve it on the hosts through a backend, start
it, supervise it, return its RunResult. `ddpctl up`, doctor's collective jobs and the Python API
all come through here; progress goes to an Observer, never to print."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from inventory import Job
from orchestrator.account.events import EventLog
from orchestrator.errors import HostsFailed
from orchestrator.hostops.runrecord import new_record, write_record
from orchestrator.launch.backends.base import Backend, DetachReport
from orchestrator.launch.inline import InlineProgram
from orchestrator.launch.monitor_api import MonitorFactory, no_monitors
from orchestrator.launch.observer import Observer
from orchestrator.launch.options import LaunchOptions
from orchestrator.launch.plan import LaunchPlan, build_plan, new_job_id
from orchestrator.launch.result import RunResult
from orchestrator.launch.supervise import Supervision


def _quiet(_text: str) -> None:
    return None


def plan_job(job: Job, backend: Backend, options: LaunchOptions | None = None, *, settle: bool = False,
             inline: InlineProgram | None = None, observer: Observer | None = None,
             job_id: str | None = None) -> LaunchPlan:
    """The exact per-host commands. settle=False (the dry run) only looks at the hosts, and only
    when the job needs them (nproc "gpu"/"cpu"/"auto", master_port "auto"); settle=True also
    frees a stale master port, as a launch does."""
    options = options or LaunchOptions()
    notice = observer.on_notice if observer is not None else _quiet
    resolved = backend.resolve(job, options, notice, settle)
    if resolved.hosts is not None:
        job = replace(job, hosts=resolved.hosts)
    return build_plan(job, job_id or new_job_id(job.name), resolved.nprocs, resolved.master_port, inline,
                      master_addr=resolved.master_addr, picked_env=resolved.env, local_addrs=resolved.local_addrs)


def run_plan(plan: LaunchPlan, backend: Backend, observer: Observer,
             options: LaunchOptions | None = None, monitors: MonitorFactory = no_monitors,
             events: EventLog | None = None) -> RunResult:
    """Start a settled plan and supervise it to the end (fail fast, no orphans), with the monitors
    `monitors` makes for it (orchestrator/watch/factory.py: `up`'s); its events go to `events`
    (its run's, else a log of its own in runs/<run id>/)."""
    options = options or LaunchOptions()
    return Supervision(plan, backend, observer, options.run_dir_of(plan.job_id), options,
                       monitors(plan, options), events).run()


def sync_code(job: Job, backend: Backend, observer: Observer, options: LaunchOptions) -> None:
    """[sync] first, so the pre-launch checks already see every host's copy; a host that could
    not be synced stops the launch before any rank starts."""
    if job.sync is None:
        return
    if not options.sync:
        observer.on_notice("[sync] skipped (--no-sync): the hosts run the copy they have")
        return
    report = backend.sync(job, options, observer.on_sync)
    if report is None:
        observer.on_notice(f"[sync] does not apply to the {backend.name} backend: its nodes share the "
                           "cluster's filesystem")
    elif not report.ok:
        raise HostsFailed("sync", list(report.failed.values()))


def launch(job: Job, backend: Backend, observer: Observer, options: LaunchOptions | None = None, *,
           inline: InlineProgram | None = None, attempt: Attempt | None = None,
           monitors: MonitorFactory = no_monitors, job_id: str | None = None,
           events: EventLog | None = None) -> RunResult:
    """Sync, pre-launch round trip, plan, start, supervise: the whole of `ddpctl up` (one attempt
    of it, where orchestrator/restarts/loop.py runs the job again after a failure). `job_id`: the
    launch's id, made before (else here); `events`: the run's events log (orchestrator/account/)."""
    options = options or LaunchOptions()
    if attempt is not None:
        options = replace(options, run_dir=attempt.run_dir)
    if inline is None:
        sync_code(job, backend, observer, options)
    job_id = attempt.job_id if attempt is not None else job_id
    plan = plan_job(job, backend, options, settle=True, inline=inline, observer=observer, job_id=job_id)
    if attempt is not None:
        plan = replace(plan, run_id=attempt.run_id)
    record_run(plan, backend, options, detached=False)
    observer.on_plan(plan, options.run_dir_of(plan.job_id))
    return run_plan(plan, backend, observer, options, monitors, events)


def record_run(plan: LaunchPlan, backend: Backend, options: LaunchOptions, detached: bool) -> None:
    """The run record here (orchestrator/hostops/runrecord.py): the id alone finds the job later."""
    job = plan.job
    write_record(options.runs_dir, new_record(
        plan.run_id or plan.job_id, job.name, [hl.host.name for hl in plan.hosts], job.inventory.source, job.source,
        backend.name, job.slurm.login if job.slurm is not None else None, options.reach, detached))


@dataclass(frozen=True)
class Attempt:
    """One attempt of a restarted job: its own job id and run directory, the run's shared id."""

    run_id: str
    job_id: str
    run_dir: Path


@dataclass(frozen=True)
class Detached:
    plan: LaunchPlan
    report: DetachReport


def detach(job: Job, backend: Backend, observer: Observer, options: LaunchOptions | None = None) -> Detached:
    """Plan and start the job to run on without us; `ddpctl ps/logs/down` take over."""
    options = options or LaunchOptions()
    sync_code(job, backend, observer, options)
    plan = plan_job(job, backend, options, settle=True, observer=observer)
    record_run(plan, backend, options, detached=True)
    observer.on_plan(plan, options.run_dir_of(plan.job_id))
    return Detached(plan, backend.detach(plan, options))
