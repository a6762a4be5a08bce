"""`ddpctl doctor`: check every host in parallel and print a hosts × checks table and findings."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from inventory import ConfigError
from orchestrator.commands.common import InventoryOpt, JsonOpt, console, err_console, handle_errors, ssh_flags
from orchestrator.doctor.runner import DoctorRequest, LaunchPathChecks, load_target, run
from orchestrator.remote.ssh_options import Connection
from orchestrator.sizes import size_text

if TYPE_CHECKING:
    from orchestrator.doctor.collective import BandwidthReport
    from train_jobs.hostcheck.figures import DeepFigures

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
    checked = run(DoctorRequest(target, connection, master_port, timeout, not no_cache, launch_path), notice)
    for warning in checked.ledger_warnings:
        err_console.print(f"[yellow]ddpctl: {escape(warning)}[/]")
    from orchestrator.checks.render import render, to_json

    if json_out:
        typer.echo(to_json(checked.report, strict))
    else:
        render(checked.report, console, strict)
        if checked.bandwidth is not None and checked.bandwidth.table:
            render_bandwidth(checked.bandwidth, console)
        if checked.report.deep is not None:
            render_deep(checked.report.deep, console)
    raise typer.Exit(checked.report.exit_code(strict))


def explain(name: str) -> None:
    """`--explain CHECK`: the check's entry, as Markdown on a terminal, as its text elsewhere."""
    from rich.markdown import Markdown

    from orchestrator.checks import catalog
    from orchestrator.checks import explain as entries

    check = entries.resolve(name)
    if check is None:
        names = ", ".join(f"{s.name} ({s.column})" if s.column else s.name for s in catalog.specs())
        raise ConfigError(f"doctor has no check {name!r}", key="--explain", hint=f"one of: {names}")
    text = entries.entry(check)
    if console.is_terminal:
        console.print(Markdown(text))
    else:
        typer.echo(text, nl=False)
    typer.echo(f"\n(also in {entries.docs_link(check)})")


def render_bandwidth(bw: BandwidthReport, out: Console) -> None:
    assert bw.table is not None
    table = Table("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)",
                  title=f"all_reduce, {bw.table['world_size']} ranks, {bw.table['backend']}")
    for r in bw.table["results"]:
        table.add_row(size_text(r["size_bytes"]), f"{r['time_us']:.1f}", f"{r['algbw_gbps']:.3f}",
                      f"{r['busbw_gbps']:.3f}")
    out.print(table)


def render_deep(figures: DeepFigures, out: Console) -> None:
    """--deep's figures per host: each device's compute, and the range of its links."""
    from orchestrator.checks.compute import flops_text

    table = Table("host", "compute", "links (slowest .. fastest, MB/s)",
                  title=f"doctor --deep: {figures.rounds} round(s), {figures.backend}")
    for rank, host in enumerate(figures.hosts or ()):
        compute = ", ".join(flops_text(d.tflops) for d in figures.compute if d.rank == rank)
        rates = sorted(link.figure.mbps for link in figures.links if rank in (link.a, link.b))
        links = f"{_rate(rates[0])} .. {_rate(rates[-1])} ({len(rates)})" if rates else "-"
        table.add_row(host, compute, links)
    out.print(table)


def _rate(mbps: float) -> str:
    return f"{mbps:,.0f}" if mbps >= 10 else f"{mbps:.1f}"
