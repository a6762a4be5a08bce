"""The Python entry point: `up(job, **overrides) -> RunResult`, `plan(...)` and
`doctor(job, ...) -> DoctorReport` (orchestrator/doctor/runner.py), for notebooks and sweep
scripts. The same launch core as `ddpctl up`; bad input raises the same located
`ConfigError` the CLI prints, a host failure a `HostError` / `HostsFailed`, a busy master port
`LaunchBlocked`.

    from orchestrator import up
    result = up("train_jobs/toy/job.toml", nproc_per_node=2, env={"LR": "0.1"})
    assert result.ok, result.first_failure
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from inventory import ConfigError, Job, JobOverrides, NprocSpec, apply_overrides, load_job
from orchestrator.doctor.runner import DoctorReport, doctor
from orchestrator.launch import core
from orchestrator.launch.backends.choose import backend_for
from orchestrator.launch.observer import Observer, Plain
from orchestrator.launch.options import LaunchOptions, OnHang
from orchestrator.launch.plan import LaunchPlan
from orchestrator.launch.result import RunResult
from orchestrator.remote.pool import make_pool
from orchestrator.remote.ssh_options import DEFAULT_PARALLEL, connection_of
from orchestrator.run_up import Finished, UpRequest, run_up

__all__ = ["DoctorReport", "doctor", "load", "plan", "up"]

JobSpec = Job | str | Path


def load(job: JobSpec, *, nproc_per_node: NprocSpec | None = None, master_port: int | str | None = None,
         env: Mapping[str, str] | None = None, hosts: Sequence[str] | None = None,
         backend: Literal["ssh", "slurm"] | None = None) -> Job:
    """The job (a job.toml path or a Job) with the overrides applied and validated, as the CLI's
    --nproc-per-node / --master-port / -e / --hosts / --backend would."""
    if master_port is not None and master_port != "auto" and not isinstance(master_port, int):
        raise ConfigError(f"master_port must be a port number or \"auto\", got {master_port!r}",
                          key="master_port", hint="e.g. master_port=29521")
    overrides = JobOverrides(nproc_per_node=nproc_per_node, master_port=master_port,  # type: ignore[arg-type]
                             env=tuple((env or {}).items()), hosts=tuple(hosts) if hosts is not None else None,
                             backend=backend)
    if isinstance(job, Job):
        return apply_overrides(job, overrides)
    return load_job(Path(job), overrides)


def up(job: JobSpec, *, nproc_per_node: NprocSpec | None = None, master_port: int | str | None = None,
       env: Mapping[str, str] | None = None, hosts: Sequence[str] | None = None,
       backend: Literal["ssh", "slurm"] | None = None, observer: Observer | None = None,
       runs_dir: str | Path = "runs", grace: float = 10.0,
       hang_timeout: float | None = None, on_hang: OnHang = "report", free_port: bool = False,
       nccl_debug: bool = False, checks: bool = True, join_timeout: float | None = None,
       lost_after: float | None = None, sync: bool = True, ssh_config: str | Path | None = None,
       known_hosts: Sequence[str | Path] = (),
       accept_new_host_keys: bool = False, parallel: int = DEFAULT_PARALLEL,
       connect_timeout: float = 10.0) -> RunResult:
    """Run the job on its hosts to the end and return its RunResult (exit code, per-host state,
    the first failing rank's exception as `root_cause`, the watchdog's diagnosis as `cause`).
    Output goes to `observer` (default: printed as `[host:rank] line`); `launch.observer.Collected`
    keeps it instead. A pre-launch check that fails raises `launch.preflight.ChecksFailed` with
    doctor's findings (`checks=False` skips them); `join_timeout` and `lost_after` (seconds a silent
    host may stay out of reach: docs/running.md's fault model) override the job file's. With [sync], the
    source goes to every host first (`sync=False` skips it). The result's `loss` names a host that
    was lost, where that is the cause."""
    spec = load(job, nproc_per_node=nproc_per_node, master_port=master_port, env=env, hosts=hosts,
                backend=backend)
    options = LaunchOptions(grace=grace, hang_timeout=hang_timeout, on_hang=on_hang, nccl_debug=nccl_debug,
                            free_port=free_port, runs_dir=Path(runs_dir), checks=checks, join_timeout=join_timeout,
                            lost_after=lost_after, sync=sync)
    connection = connection_of(ssh_config, known_hosts, accept_new_host_keys, parallel, connect_timeout)
    request = UpRequest(options, connection, max_restarts=0)  # one attempt: docs/python-api.md
    outcome = run_up(spec, request, observer or Plain(spec.watch.pulse))
    assert isinstance(outcome, Finished), outcome  # neither a dry run nor detached, no restarts
    return outcome.result


def plan(job: JobSpec, *, nproc_per_node: NprocSpec | None = None, master_port: int | str | None = None,
         env: Mapping[str, str] | None = None, hosts: Sequence[str] | None = None,
         ssh_config: str | Path | None = None, known_hosts: Sequence[str | Path] = (),
         accept_new_host_keys: bool = False, parallel: int = DEFAULT_PARALLEL,
         connect_timeout: float = 10.0) -> LaunchPlan:
    """What `up` would run on each host (the dry run): argv, env, workdir, node rank. Contacts the
    hosts only when the job needs them (nproc "gpu"/"cpu"/"auto", master_port "auto"). A Slurm
    job's plan has nodes node0.. in Slurm's task order."""
    spec = load(job, nproc_per_node=nproc_per_node, master_port=master_port, env=env, hosts=hosts)
    connection = connection_of(ssh_config, known_hosts, accept_new_host_keys, parallel, connect_timeout)
    with make_pool(connection) as pool:
        return core.plan_job(spec, backend_for(pool, spec))
