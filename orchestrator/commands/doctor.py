"""`ddpctl doctor`: check every host in parallel and print a hosts × checks table and findings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from inventory import ConfigError, Inventory, Job, JobOverrides, load_job
from orchestrator.commands.common import (
    AcceptNewOpt,
    ConnectTimeoutOpt,
    InventoryOpt,
    JsonOpt,
    KnownHostsOpt,
    ParallelOpt,
    SshConfigOpt,
    console,
    err_console,
    handle_errors,
    load_inventory_arg,
)
from orchestrator.remote.pool import DEFAULT_PARALLEL, make_pool

if TYPE_CHECKING:
    from orchestrator.doctor import DoctorContext, Report
    from orchestrator.doctor.collective import BandwidthReport
    from orchestrator.launch.backends.base import Backend

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
    return load_inventory_arg(inventory)


def build_context(target: Job | Inventory, master_port: int | None, timeout: float,
                  use_cache: bool = True) -> DoctorContext:
    from orchestrator.doctor.context import from_inventory, from_job

    if isinstance(target, Job):
        return from_job(target, master_port, timeout, use_cache)
    return from_inventory(target, master_port, timeout, use_cache)


@handle_errors
def doctor_command(
    job_file: JobArg = None,
    inventory: InventoryOpt = None,
    json_out: JsonOpt = False,
    strict: StrictOpt = False,
    master_port: MasterPortOpt = None,
    timeout: TimeoutOpt = 120.0,
    no_cache: NoCacheOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
    accept_new: AcceptNewOpt = False,
    parallel: ParallelOpt = DEFAULT_PARALLEL,
    connect_timeout: ConnectTimeoutOpt = 10.0,
    smoke: Annotated[bool, typer.Option(
        "--smoke", help="Then run a gloo all_reduce across all hosts through the real launch path.",
        rich_help_panel="Launch-path checks")] = False,
    bandwidth: Annotated[bool, typer.Option(
        "--bandwidth", help="Then time all_reduce (1 KiB .. --max-bytes) across the hosts.",
        rich_help_panel="Launch-path checks")] = False,
    pairs: Annotated[bool, typer.Option(
        "--pairs", help="With --bandwidth: also measure each host pair and flag slow ones.",
        rich_help_panel="Launch-path checks")] = False,
    max_bytes: Annotated[str, typer.Option(
        "--max-bytes", help="Largest all_reduce message for --bandwidth (K/M/G suffixes).",
        rich_help_panel="Launch-path checks")] = "64M",
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="Where launch-path check logs go.",
                                           rich_help_panel="Launch-path checks")] = Path("runs"),
    explain_check: Annotated[str | None, typer.Option(
        "--explain", metavar="CHECK", help="Print what CHECK's findings mean and their fixes (a column's "
        "name: ssh, fw, if, …), and contact no host.")] = None,
) -> None:
    """Check every host (SSH, torch, versions, firewall, ports, NCCL/Gloo interfaces, DNS, clock).

    Exit 0 with no errors, 1 with any (--strict: or warnings), 2 for bad input.

    \b
    Examples:
      ddpctl doctor job.toml               # every check on the job's hosts
      ddpctl doctor -i hosts.toml --smoke  # then a real all_reduce across them
    """
    if explain_check is not None:
        explain(explain_check)
        return
    target = load_target(job_file, inventory, master_port)
    job = target if isinstance(target, Job) else None
    if job is not None and job.slurm is not None and (smoke or bandwidth):
        raise ConfigError("--smoke and --bandwidth run over SSH, not on a Slurm job", key="--smoke",
                          hint="drop them for a job with a [slurm] table")
    pool = make_pool(ssh_config, known_hosts, accept_new, parallel, connect_timeout)
    if job is None or job.slurm is None:
        # The SSH handshakes run while the doctor core is imported (bench/doctor_fanout.py).
        pool.connect_ahead(target.hosts)
    from orchestrator.doctor import run_doctor
    from orchestrator.doctor.render import render, to_json

    ctx = build_context(target, master_port, timeout, not no_cache)

    def notice(text: str) -> None:
        if not json_out:
            err_console.print(f"[dim]doctor: {escape(text)}[/]")

    # The Slurm doctor and the launch-path checks load the launch core: imported only when used
    # (a plain doctor run's start-up is part of its wall time, bench/doctor_fanout.py).
    with pool:
        if job is not None and job.slurm is not None:
            from orchestrator.doctor.slurm import run_slurm_doctor

            report = run_slurm_doctor(job, pool, timeout, not no_cache, notice)
        else:
            report = run_doctor(ctx, pool, notice)
        bw = None
        if smoke or bandwidth:
            from orchestrator.doctor.collective import job_for
            from orchestrator.launch.backends.ssh import SshBackend

            bw = run_launch_checks(report, job_for(ctx, job), SshBackend(pool), notice, smoke, bandwidth, pairs,
                                   max_bytes, runs_dir)
    if json_out:
        typer.echo(to_json(report, strict))
    else:
        render(report, console, strict)
        if bw is not None and bw.table:
            render_bandwidth(bw, console)
    raise typer.Exit(report.exit_code(strict))


def explain(name: str) -> None:
    """`--explain CHECK`: the check's entry, as Markdown on a terminal, as its text elsewhere."""
    from rich.markdown import Markdown

    from orchestrator.doctor import explain as entries

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


def run_launch_checks(report: Report, job: Job, backend: Backend, notice: Callable[[str], None], smoke: bool,
                      bandwidth: bool, pairs: bool, max_bytes: str, runs_dir: Path) -> BandwidthReport | None:
    """After the other checks pass: the smoke test and/or the bandwidth table, as findings."""
    from orchestrator.doctor import CheckStatus, Finding
    from orchestrator.doctor.collective import bandwidth_report, smoke_findings

    wanted = [c for c, on in (("smoke", smoke), ("bandwidth", bandwidth)) if on]
    report.checks += wanted
    if report.count(CheckStatus.FAIL):
        report.findings += [Finding(c, CheckStatus.SKIP, None, "not run: other checks failed",
                                    fix="fix the errors above, then rerun") for c in wanted]
        return None
    if smoke:
        notice("running the gloo all_reduce smoke test through the launch path")
        report.findings += smoke_findings(job, backend, runs_dir)
    if bandwidth and not report.count(CheckStatus.FAIL):
        notice("timing all_reduce across the hosts" + (" and each pair" if pairs else ""))
        bw = bandwidth_report(job, backend, runs_dir, pairs, max_bytes)
        report.findings += bw.findings
        report.bandwidth, report.pairs = bw.table, bw.pairs
        return bw
    return None


def render_bandwidth(bw: BandwidthReport, out: Console) -> None:
    assert bw.table is not None
    table = Table("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)",
                  title=f"all_reduce, {bw.table['world_size']} ranks, {bw.table['backend']}")
    for r in bw.table["results"]:
        table.add_row(_size(r["size_bytes"]), f"{r['time_us']:.1f}", f"{r['algbw_gbps']:.3f}",
                      f"{r['busbw_gbps']:.3f}")
    out.print(table)
    for pair, value in bw.pairs.items():
        out.print(f"  pair {pair}: peak busbw {value:.3f} GB/s", markup=False)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"
