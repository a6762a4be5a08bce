"""`ddpctl doctor`: check every host in parallel and print a hosts × checks table and findings."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from inventory import ConfigError, Inventory, Job, JobOverrides, load_job
from orchestrator.commands.common import InventoryOpt, JsonOpt, console, err_console, handle_errors, ssh_flags
from orchestrator.hostops.targets import inventory_at
from orchestrator.remote.pool import HostPool, make_pool
from orchestrator.remote.ssh_options import Connection

if TYPE_CHECKING:
    from orchestrator.doctor import DoctorContext, Report
    from orchestrator.doctor.collective import BandwidthReport

JobArg = Annotated[Path | None, typer.Argument(help="Job file (job.toml); its hosts, env and "
                                               "rendezvous are checked.")]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Warnings count as errors (exit 1).")]
MasterPortOpt = Annotated[int | None, typer.Option("--master-port", min=1, max=65535,
                                                   help="Master port to check (default: the "
                                                   "job's, else 29500).")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Re-import torch on every host "
                                          "instead of reusing its cached facts.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", min=1.0,
                                           help="Seconds for each host's facts round trip.")]


def load_target(job_file: Path | None, inventory: Path | None,
                master_port: int | None) -> Job | Inventory:
    """What doctor checks: the job file, else the inventory (else this machine)."""
    if job_file is not None and inventory is not None:
        raise ConfigError("give a job file or --inventory, not both", key="--inventory",
                          hint="the job file names its inventory; drop -i")
    if job_file is not None:
        return load_job(job_file, JobOverrides(master_port=master_port) if master_port else None)
    return inventory_at(inventory)


def build_context(target: Job | Inventory, master_port: int | None, timeout: float,
                  use_cache: bool = True) -> DoctorContext:
    from orchestrator.checks.context import from_inventory, from_job

    if isinstance(target, Job):
        return from_job(target, master_port, timeout, use_cache)
    return from_inventory(target, master_port, timeout, use_cache)


SmokeOpt = Annotated[bool, typer.Option(
    "--smoke", help="Then run a gloo all_reduce across all hosts through the real launch path.",
    rich_help_panel="Launch-path checks")]
BandwidthOpt = Annotated[bool, typer.Option(
    "--bandwidth", help="Then time all_reduce (1 KiB .. --max-bytes) across the hosts.",
    rich_help_panel="Launch-path checks")]
DeepOpt = Annotated[bool, typer.Option(
    "--deep", help="Then find the slow host: a timed matmul per host and GPU, link rounds between "
    "every pair of hosts (a covering schedule past the budget), GPU health (ECC, throttling, PCIe, Xid).",
    rich_help_panel="Launch-path checks")]
PairsOpt = Annotated[bool, typer.Option("--pairs", hidden=True, help="Replaced by --deep.")]
MaxBytesOpt = Annotated[str, typer.Option(
    "--max-bytes", help="Largest all_reduce message for --bandwidth (K/M/G suffixes).",
    rich_help_panel="Launch-path checks")]
RunsDirOpt = Annotated[Path, typer.Option("--runs-dir", help="Where launch-path check logs go.",
                                          rich_help_panel="Launch-path checks")]
ExplainOpt = Annotated[str | None, typer.Option(
    "--explain", metavar="CHECK", help="Print what CHECK's findings mean and their fixes (a column's "
    "name: ssh, fw, if, …), and contact no host.")]


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


@handle_errors
@ssh_flags()
def doctor_command(
    job_file: JobArg = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    strict: StrictOpt = False,
    master_port: MasterPortOpt = None,
    timeout: TimeoutOpt = 120.0,
    no_cache: NoCacheOpt = False,
    *,
    connection: Connection,
    smoke: SmokeOpt = False,
    bandwidth: BandwidthOpt = False,
    deep: DeepOpt = False,
    pairs: PairsOpt = False,
    max_bytes: MaxBytesOpt = "64M",
    runs_dir: RunsDirOpt = Path("runs"),
    explain_check: ExplainOpt = None,
) -> None:
    """Check every host for what would make a launch fail or hang.

    SSH, torch, versions, firewall, ports, NCCL/Gloo interfaces, DNS, clock, and more.

    Exit 0 with no errors, 1 with any (--strict: or warnings), 2 for bad input.

    \b
    Examples:
      ddpctl doctor job.toml               # every check on the job's hosts
      ddpctl doctor job.toml --deep        # then find a slow link, GPU or host
    """
    if pairs:
        raise ConfigError("--pairs was replaced by --deep", key="--pairs",
                          hint="ddpctl doctor job.toml --deep: link rounds between every pair of hosts, at any size")
    if explain_check is not None:
        explain(explain_check)
        return
    target = load_target(job_file, inventory, master_port)

    def notice(text: str) -> None:
        if not json_out:
            err_console.print(f"[dim]doctor: {escape(text)}[/]")

    launch_path = LaunchPathChecks(smoke, bandwidth, deep, max_bytes, runs_dir)
    checked = check_hosts(target, connection, master_port, timeout, not no_cache, launch_path, notice)
    for warning in checked.ledger_warnings:
        err_console.print(f"[yellow]ddpctl: {escape(warning)}[/]")
    from orchestrator.checks.render import render, to_json

    if json_out:
        typer.echo(to_json(checked.report, strict))
    else:
        render(checked.report, console, strict)
        if checked.bandwidth is not None and checked.bandwidth.table:
            render_bandwidth(checked.bandwidth, console)
        if checked.report.deep:
            render_deep(checked.report.deep, console)
    raise typer.Exit(checked.report.exit_code(strict))


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


def explain(name: str) -> None:
    """`--explain CHECK`: the check's entry, as Markdown on a terminal, as its text elsewhere."""
    from rich.markdown import Markdown

    from orchestrator.checks import explain as entries

    check = entries.resolve(name)
    if check is None:
        names = ", ".join(f"{c} ({entries.SHORT[c]})" if c in entries.SHORT else c for c in entries.CHECK_ORDER)
        raise ConfigError(f"doctor has no check {name!r}", key="--explain", hint=f"one of: {names}")
    text = entries.entry(check)
    if console.is_terminal:
        console.print(Markdown(text))
    else:
        typer.echo(text, nl=False)
    typer.echo(f"\n(also in {entries.docs_link(check)})")


def run_launch_checks(report: Report, job: Job, pool: HostPool, notice: Callable[[str], None],
                      launch_path: LaunchPathChecks, timeout: float) -> BandwidthReport | None:
    """After the other checks pass: the smoke test, the bandwidth table and/or the deep checks,
    as findings."""
    from orchestrator.doctor import CheckStatus, Finding
    from orchestrator.doctor.collective import bandwidth_report, smoke_findings
    from orchestrator.launch.backends.ssh import SshBackend

    wanted = [c for c, on in (("smoke", launch_path.smoke), ("bandwidth", launch_path.bandwidth)) if on]
    if launch_path.deep:
        from orchestrator.doctor.deep import CHECKS

        wanted += CHECKS
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


def render_bandwidth(bw: BandwidthReport, out: Console) -> None:
    assert bw.table is not None
    table = Table("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)",
                  title=f"all_reduce, {bw.table['world_size']} ranks, {bw.table['backend']}")
    for r in bw.table["results"]:
        table.add_row(_size(r["size_bytes"]), f"{r['time_us']:.1f}", f"{r['algbw_gbps']:.3f}",
                      f"{r['busbw_gbps']:.3f}")
    out.print(table)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def render_deep(figures: dict[str, Any], out: Console) -> None:
    """--deep's figures per host: each device's compute, and the range of its links."""
    from orchestrator.checks.compute import flops_text

    hosts: list[str] = figures["hosts"]
    table = Table("host", "compute", "links (slowest .. fastest, MB/s)",
                  title=f"doctor --deep: {figures['rounds']} round(s), {figures['backend']}")
    for rank, host in enumerate(hosts):
        devices = [d for d in figures["compute"] if d["rank"] == rank]
        compute = ", ".join(flops_text(d["tflops"]) for d in devices)
        rates = sorted(link["mbps"] for link in figures["links"] if rank in (link["a"], link["b"]))
        links = f"{rates[0]:,.0f} .. {rates[-1]:,.0f} ({len(rates)})" if rates else "-"
        table.add_row(host, compute, links)
    out.print(table)
