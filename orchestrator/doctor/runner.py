"""doctor's runner: `run(DoctorRequest) -> DoctorReport`, the checks on a target's hosts (a Slurm
job's in its allocation), then the launch-path checks where asked (--smoke, --bandwidth, --deep),
and the run recorded in the host ledger. The CLI (orchestrator/commands/doctor.py), `ddpctl hosts
--release --check` and the Python API (`doctor()`, which is `orchestrator.doctor(...)`) call it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from inventory import ConfigError, Inventory, Job, JobOverrides, apply_overrides, load_job
from orchestrator.hostops.targets import inventory_at
from orchestrator.remote.pool import HostPool, make_pool
from orchestrator.remote.ssh_options import DEFAULT_PARALLEL, Connection, connection_of

if TYPE_CHECKING:
    from orchestrator.checks.model import DoctorContext, Finding, Report
    from orchestrator.doctor.collective import BandwidthReport


def build_context(target: Job | Inventory, master_port: int | None, timeout: float,
                  use_cache: bool = True) -> DoctorContext:
    from orchestrator.checks.context import from_inventory, from_job

    if isinstance(target, Job):
        return from_job(target, master_port, timeout, use_cache)
    return from_inventory(target, master_port, timeout, use_cache)


@dataclass(frozen=True)
class LaunchPathChecks:
    """--smoke and --bandwidth: collective jobs run through the real launch path after the checks."""

    smoke: bool = False
    bandwidth: bool = False
    deep: bool = False
    max_bytes: str = "64M"
    runs_dir: Path = Path("runs")

    @property
    def wanted(self) -> bool:
        return self.smoke or self.bandwidth or self.deep


@dataclass(frozen=True)
class DoctorRequest:
    """One doctor run: what it checks (a job, else an inventory), how it reaches the hosts, and
    the launch-path checks asked for."""

    target: Job | Inventory
    connection: Connection = field(default_factory=Connection)
    master_port: int | None = None
    timeout: float = 120.0  # seconds for each host's facts round trip
    use_cache: bool = True  # each host's cached torch facts (False: import torch again)
    launch_path: LaunchPathChecks = field(default_factory=LaunchPathChecks)


@dataclass(frozen=True)
class DoctorReport:
    """What one doctor run found: the checks' report (hosts, findings, phases, the --deep
    figures), the bandwidth table where --bandwidth ran, and the host ledger's warnings (it never
    stops doctor)."""

    report: Report
    bandwidth: BandwidthReport | None = None
    ledger_warnings: tuple[str, ...] = ()

    @property
    def findings(self) -> list[Finding]:
        return self.report.findings

    def exit_code(self, strict: bool = False) -> int:
        """0 with no errors, 1 with any (`strict`: or warnings), as `ddpctl doctor` exits."""
        return self.report.exit_code(strict)

    @property
    def ok(self) -> bool:
        return self.exit_code() == 0


def load_target(job_file: Path | None, inventory: Path | None, master_port: int | None) -> Job | Inventory:
    """What doctor checks: the job file, else the inventory (else this machine)."""
    if job_file is not None and inventory is not None:
        raise ConfigError("give a job file or --inventory, not both", key="--inventory",
                          hint="the job file names its inventory; drop -i")
    if job_file is not None:
        return load_job(job_file, JobOverrides(master_port=master_port) if master_port else None)
    return inventory_at(inventory)


def run(request: DoctorRequest, notice: Callable[[str], None] = lambda _: None) -> DoctorReport:
    """Every check on the target's hosts (a Slurm job's in its allocation), then the launch-path
    checks where asked, and the run recorded in the host ledger."""
    target, launch_path, timeout = request.target, request.launch_path, request.timeout
    job = target if isinstance(target, Job) else None
    if job is not None and job.slurm is not None and launch_path.wanted:
        raise ConfigError("--smoke, --bandwidth and --deep run over SSH, not on a Slurm job", key="--smoke",
                          hint="drop them for a job with a [slurm] table")
    pool = make_pool(request.connection)
    if job is None or job.slurm is None:
        # The SSH handshakes run while the doctor core is imported (bench/doctor_fanout.py).
        pool.connect_ahead(target.hosts)
    from orchestrator.doctor.core import run_doctor

    ctx = build_context(target, request.master_port, timeout, request.use_cache)
    # The Slurm doctor and the launch-path checks load the launch core: imported only when used
    # (a plain doctor run's start-up is part of its wall time, bench/doctor_fanout.py).
    with pool:
        if job is not None and job.slurm is not None:  # Slurm picks the nodes: not in the host ledger
            from orchestrator.doctor.slurm_doctor import run_slurm_doctor

            return DoctorReport(run_slurm_doctor(job, pool, timeout, request.use_cache, notice))
        report = run_doctor(ctx, pool, notice)
        bw = None
        if launch_path.wanted:
            from orchestrator.doctor.collective import job_for

            started = time.monotonic()
            bw = run_launch_checks(report, job_for(ctx, job), pool, notice, launch_path, timeout)
            report.phases["launch_checks_s"] = time.monotonic() - started
            report.elapsed_s += report.phases["launch_checks_s"]
    from orchestrator.doctor.core import remember

    return DoctorReport(report, bw, tuple(remember(report, ctx.hosts)))


def doctor(job: Job | str | Path | None = None, *, inventory: Inventory | str | Path | None = None,
           master_port: int | None = None, timeout: float = 120.0, use_cache: bool = True,
           smoke: bool = False, bandwidth: bool = False, deep: bool = False, max_bytes: str = "64M",
           runs_dir: str | Path = "runs", ssh_config: str | Path | None = None,
           known_hosts: Sequence[str | Path] = (), accept_new_host_keys: bool = False,
           parallel: int = DEFAULT_PARALLEL, connect_timeout: float = 10.0,
           notice: Callable[[str], None] = lambda _: None) -> DoctorReport:
    """`ddpctl doctor` from Python (`orchestrator.doctor(...)`): every check on the job's hosts
    (a job.toml path or a Job), else the inventory's (a hosts.toml path or an Inventory), else this
    machine; `smoke`, `bandwidth` and `deep` as the flags. The keywords mirror the CLI's. Bad input
    raises the located ConfigError the CLI prints; a host's failure is a finding, never raised."""
    if job is not None and inventory is not None:
        raise ConfigError("give a job or an inventory, not both", key="inventory",
                          hint="the job file names its inventory")
    target: Job | Inventory
    if isinstance(job, Job):
        target = apply_overrides(job, JobOverrides(master_port=master_port)) if master_port else job
    elif isinstance(inventory, Inventory):
        target = inventory
    else:
        target = load_target(None if job is None else Path(job), None if inventory is None else Path(inventory),
                             master_port)
    launch_path = LaunchPathChecks(smoke, bandwidth, deep, max_bytes, Path(runs_dir))
    connection = connection_of(ssh_config, known_hosts, accept_new_host_keys, parallel, connect_timeout)
    return run(DoctorRequest(target, connection, master_port, timeout, use_cache, launch_path), notice)


def run_launch_checks(report: Report, job: Job, pool: HostPool, notice: Callable[[str], None],
                      launch_path: LaunchPathChecks, timeout: float) -> BandwidthReport | None:
    """After the other checks pass: the smoke test, the bandwidth table and/or the deep checks,
    as findings."""
    from orchestrator.checks.model import CheckStatus, Finding
    from orchestrator.doctor.collective import bandwidth_report, smoke_findings
    from orchestrator.launch.backends.ssh import SshBackend

    wanted = [c for c, on in (("smoke", launch_path.smoke), ("bandwidth", launch_path.bandwidth)) if on]
    if launch_path.deep:
        from orchestrator.doctor.deep import checks

        wanted += checks()
    report.checks += wanted
    if report.count(CheckStatus.FAIL):
        report.findings += [Finding(c, CheckStatus.SKIP, None, "not run: other checks failed",
                                    fix="fix the errors above, then rerun") for c in wanted]
        return None
    backend = SshBackend(pool)  # one for every launch-path job
    if launch_path.smoke:
        notice("running the gloo all_reduce smoke test through the launch path")
        report.findings += smoke_findings(job, backend, launch_path.runs_dir)
    bw = None
    if launch_path.bandwidth and not report.count(CheckStatus.FAIL):
        notice("timing all_reduce across the hosts")
        bw = bandwidth_report(job, backend, launch_path.runs_dir, launch_path.max_bytes)
        report.findings += bw.findings
        report.bandwidth = bw.table
    if launch_path.deep and not report.count(CheckStatus.FAIL):
        from orchestrator.doctor.deep import deep_report

        deep = deep_report(job, backend, pool, launch_path.runs_dir, timeout, notice)
        report.findings += deep.findings
        report.deep = deep.figures
    return bw
