"""doctor's runner: the checks on a target's hosts (a Slurm job's in its allocation), then the
launch-path checks where asked (--smoke, --bandwidth, --deep), and the run recorded in the host
ledger. The CLI (orchestrator/commands/doctor.py) and `ddpctl hosts --release --check` call it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from inventory import ConfigError, Inventory, Job
from orchestrator.remote.pool import HostPool, make_pool
from orchestrator.remote.ssh_options import Connection

if TYPE_CHECKING:
    from orchestrator.doctor import DoctorContext, Report
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
class Checked:
    """doctor's report, and the bandwidth table where --bandwidth ran."""

    report: Report
    bandwidth: BandwidthReport | None
    ledger_warnings: tuple[str, ...] = ()  # the host ledger could not record the run (it never stops doctor)


def check_hosts(target: Job | Inventory, connection: Connection, master_port: int | None, timeout: float,
                use_cache: bool, launch_path: LaunchPathChecks, notice: Callable[[str], None]) -> Checked:
    """Every check on the target's hosts (a Slurm job's in its allocation), then the launch-path
    checks where asked."""
    job = target if isinstance(target, Job) else None
    if job is not None and job.slurm is not None and launch_path.wanted:
        raise ConfigError("--smoke, --bandwidth and --deep run over SSH, not on a Slurm job", key="--smoke",
                          hint="drop them for a job with a [slurm] table")
    pool = make_pool(connection)
    if job is None or job.slurm is None:
        # The SSH handshakes run while the doctor core is imported (bench/doctor_fanout.py).
        pool.connect_ahead(target.hosts)
    from orchestrator.doctor import run_doctor

    ctx = build_context(target, master_port, timeout, use_cache)
    # The Slurm doctor and the launch-path checks load the launch core: imported only when used
    # (a plain doctor run's start-up is part of its wall time, bench/doctor_fanout.py).
    with pool:
        if job is not None and job.slurm is not None:  # Slurm picks the nodes: not in the host ledger
            from orchestrator.doctor.slurm_doctor import run_slurm_doctor

            return Checked(run_slurm_doctor(job, pool, timeout, use_cache, notice), None)
        report = run_doctor(ctx, pool, notice)
        bw = None
        if launch_path.wanted:
            from orchestrator.doctor.collective import job_for

            started = time.monotonic()
            bw = run_launch_checks(report, job_for(ctx, job), pool, notice, launch_path, timeout)
            report.phases["launch_checks_s"] = time.monotonic() - started
            report.elapsed_s += report.phases["launch_checks_s"]
    from orchestrator.doctor import remember

    return Checked(report, bw, tuple(remember(report, ctx.hosts)))


def run_launch_checks(report: Report, job: Job, pool: HostPool, notice: Callable[[str], None],
                      launch_path: LaunchPathChecks, timeout: float) -> BandwidthReport | None:
    """After the other checks pass: the smoke test, the bandwidth table and/or the deep checks,
    as findings."""
    from orchestrator.doctor import CheckStatus, Finding
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
