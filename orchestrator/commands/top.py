"""`ddpctl top`: every host of a running job, worst first, refreshed: steps/s, GPUs, CPU, network."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.commands.common import InventoryOpt, JsonOpt, console, handle_errors, ssh_flags
from orchestrator.commands.lifecycle import BackendOpt, LoginOpt, backend_name, print_error, report_absent
from orchestrator.hostops.control import Sample, job_control
from orchestrator.hostops.jobs import JobAbsent
from orchestrator.hostops.top import DEFAULT_INTERVAL_S, TopReport, TopRow, TopState
from orchestrator.remote.ssh_options import Connection
from orchestrator.sizes import size_text

TopJobArg = Annotated[str | None, typer.Argument(
    help="A job id (or name), or the job.toml it was started from; none: every ddpctl job on the hosts.")]
COLUMNS = ("host", "state", "ranks", "steps/s", "p50/p95 ms", "GPU %", "GPU GiB", "power W", "CPU %", "RSS",
           "tx/rx MB/s", "last output", "note")
STATE_STYLE = {TopState.RUNNING: "green", TopState.NO_JOB: "dim", TopState.UNREACHABLE: "bold red",
               TopState.ERROR: "bold red"}
MB = 1e6


# -- cells --------------------------------------------------------------------------------------------

def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pair(a: float | None, b: float | None, digits: int = 0, sep: str = "/") -> str:
    if a is None and b is None:
        return "-"
    return f"{_num(a, digits)}{sep}{_num(b, digits)}"


def _bytes(n: int | None) -> str:
    return "-" if n is None else size_text(n)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 90:
        return f"{seconds:.0f}s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def _ranks(row: TopRow) -> str:
    if row.ranks_alive is None:
        return "-"
    return f"{row.ranks_alive}/{row.ranks_expected}" if row.ranks_expected is not None else str(row.ranks_alive)


def _rate(row: TopRow) -> str:
    if row.stalled:
        return "0 stalled"
    return _num(row.steps_per_s, 2)


def _util(row: TopRow) -> str:
    if row.gpu_util_min is None:
        return "-"
    if row.gpu_util_min == row.gpu_util_max:
        return _num(row.gpu_util_min)
    return _pair(row.gpu_util_min, row.gpu_util_max, sep="–")


def _net(row: TopRow) -> str:
    if row.tx_bytes_per_s is None and row.rx_bytes_per_s is None:
        return "-" if row.iface is None else f"- ({row.iface})"
    tx = None if row.tx_bytes_per_s is None else row.tx_bytes_per_s / MB
    rx = None if row.rx_bytes_per_s is None else row.rx_bytes_per_s / MB
    return f"{_pair(tx, rx, 1)} ({row.iface})"


def _note(row: TopRow) -> str:
    parts = [p for p in (row.error, row.detail) if p]
    if row.fix:
        parts.append(f"fix: {row.fix}")
    return "; ".join(parts)


def cells(row: TopRow, job: bool) -> list[str]:
    """A row's cells, in COLUMNS order (after the job's, with `job`)."""
    host = [row.host, *([row.job_id or "-"] if job else [])]
    return [*host, row.state.value, _ranks(row), _rate(row), _pair(row.p50_ms, row.p95_ms),
            _util(row), _pair(row.gpu_memory_used_gib, row.gpu_memory_total_gib, 1), _num(row.power_w),
            _num(row.cpu_pct), _bytes(row.rss_bytes), _net(row), _age(row.log_age_s), _note(row)]


def _columns(report: TopReport) -> tuple[bool, list[str]]:
    """Whether a job column is needed (rows of more than one job), and the headers."""
    job = len({r.job_id for r in report.rows if r.job_id}) > 1
    return job, [COLUMNS[0], *(["job"] if job else []), *COLUMNS[1:]]


def table(report: TopReport) -> Table:
    job, headers = _columns(report)
    t = Table(*headers, title=_title(report), title_justify="left")
    for row in report.rows:
        values = cells(row, job)
        state_at = 2 if job else 1
        styled = [Text(v) for v in values]
        styled[state_at].stylize(STATE_STYLE[row.state])
        if row.error:
            styled[-1].stylize("red")
        t.add_row(*styled)
    return t


def plain_lines(report: TopReport) -> list[str]:
    """The table as plain text: columns padded with spaces, the note last (unpadded)."""
    job, headers = _columns(report)
    grid = [headers, *(cells(r, job) for r in report.rows)]
    widths = [max(len(line[i]) for line in grid) for i in range(len(headers) - 1)]
    return [_title(report)] + ["  ".join([*(c.ljust(w) for c, w in zip(line, widths, strict=False)),
                                          line[-1]]).rstrip() for line in grid]


def _title(report: TopReport) -> str:
    what = f"job {report.job}" if report.job else "every ddpctl job"
    return f"ddpctl top: {what}, {time.strftime('%H:%M:%S')}"


# -- the loop -------------------------------------------------------------------------------------------

def show(sample: Sample, once: bool) -> TopReport:
    """Sample and show: once, or until Ctrl-C (a live table on a terminal, else plain text)."""
    if once:
        report = sample()
        if console.is_terminal:
            console.print(table(report))
        else:
            _print_plain(report)
        return report
    if not console.is_terminal:
        while True:
            _print_plain(sample())
    with Live(Text("sampling every host ..."), console=console, refresh_per_second=4) as live:
        while True:
            live.update(table(sample()))


def _print_plain(report: TopReport) -> None:
    out = console.file
    out.write("\n".join(plain_lines(report)) + "\n\n")
    out.flush()


def _exit_code(report: TopReport, absent: JobAbsent | None) -> int:
    """1: a host gave no answer, or the job named runs nowhere; else 0."""
    if absent is not None:
        report_absent(absent)
        return 1
    if report.job is not None and not report.running and not report.failed:
        print_error(f"job {report.job}: no node of it is running", "`ddpctl ps` lists the running jobs")
        return 1
    return 1 if report.failed else 0


@handle_errors
@ssh_flags(connect_timeout=5.0)
def top_command(
    job: TopJobArg = None,
    inventory: InventoryOpt = None,
    backend: BackendOpt = None,
    login: LoginOpt = None,
    interval: Annotated[float, typer.Option("--interval", min=0.2, max=30.0,
                                            help="Seconds each host samples over (the refresh period).")
                        ] = DEFAULT_INTERVAL_S,
    once: Annotated[bool, typer.Option("--once", help="Print one table and exit.")] = False,
    as_json: JsonOpt = False,
    *,
    connection: Connection,
) -> None:
    """Show every host of a running job, worst first, live.

    Refreshed every --interval seconds.

    Per host: rank processes alive, steps/s and step time p50/p95 (the slowest rank's), GPU
    utilization, memory and power (nvidia-smi), CPU % and RSS of the job's processes, tx/rx on the
    interface NCCL/Gloo uses, and the age of the last output line. A host that cannot be
    reached, or whose nvidia-smi fails, is a row with its error. Exits 1 when a host gave no
    answer or the job runs nowhere (with --once or --json).

    \b
    Examples:
      ddpctl top job.toml                           # live table; Ctrl-C ends it
      ddpctl top myjob -i hosts.toml --once --json  # one sample, as JSON
    """
    with job_control(connection, job, backend_name(backend), login, inventory) as control:
        try:
            report = show_json(control.top(interval)) if as_json else show(control.top(interval), once)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        absent = control.top_absent(report)
    raise typer.Exit(_exit_code(report, absent))


def show_json(sample: Sample) -> TopReport:
    report = sample()
    console.print_json(json.dumps(report.to_json()))
    return report
