"""`ddpctl top`: every host of a running job, worst first, refreshed: steps/s, GPUs, CPU, network."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.table import Table
from rich.text import Text

from inventory.slurm import SlurmSpec
from orchestrator.commands.common import (
    AcceptNewOpt,
    BackendChoice,
    ConnectTimeoutOpt,
    InventoryOpt,
    JsonOpt,
    KnownHostsOpt,
    ParallelOpt,
    SshConfigOpt,
    console,
    handle_errors,
    load_inventory_arg,
)
from orchestrator.commands.lifecycle import (
    BackendOpt,
    LoginOpt,
    SlurmSide,
    print_error,
    report_absent,
    require_job_file,
    resolve_target,
    slurm_side,
)
from orchestrator.hostops.jobs import JobAbsent
from orchestrator.hostops.top import DEFAULT_INTERVAL_S, HostState, TopReport, TopRow, TopSession, collect_slurm
from orchestrator.remote.pool import HostPool, make_pool
from orchestrator.remote.slurm import slurm_client

TopJobArg = Annotated[str | None, typer.Argument(
    help="A job id (or name), or the job.toml it was started from; none: every ddpctl job on the hosts.")]
COLUMNS = ("host", "state", "ranks", "steps/s", "p50/p95 ms", "GPU %", "GPU GiB", "power W", "CPU %", "RSS",
           "tx/rx MB/s", "last output", "note")
STATE_STYLE = {HostState.RUNNING: "green", HostState.NO_JOB: "dim", HostState.UNREACHABLE: "bold red",
               HostState.ERROR: "bold red"}
MB = 1e6


# -- cells --------------------------------------------------------------------------------------------

def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pair(a: float | None, b: float | None, digits: int = 0, sep: str = "/") -> str:
    if a is None and b is None:
        return "-"
    return f"{_num(a, digits)}{sep}{_num(b, digits)}"


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


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

def show(sample: Callable[[], TopReport], once: bool) -> TopReport:
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


def _slurm(job: str | None, backend: BackendChoice | None, login: str | None,
           inventory: Path | None) -> SlurmSide | None:
    if job is not None:
        return slurm_side(job, backend, login)
    if backend is BackendChoice.slurm:  # every running ddpctl job in Slurm's queue
        return SlurmSide("", login, load_inventory_arg(inventory), SlurmSpec(login=login))
    return None


def _exit_code(report: TopReport, absent: JobAbsent | None) -> int:
    """1: a host gave no answer, or the job named runs nowhere; else 0."""
    if absent is not None:
        report_absent(absent)
        return 1
    if report.job is not None and not report.running and not report.failed:
        print_error(f"job {report.job}: no node of it is running", "`ddpctl ps` lists the running jobs")
        return 1
    return 1 if report.failed else 0


def _absent(report: TopReport, answered: Sequence[str], asked: int, source: Path | None) -> JobAbsent | None:
    if report.job is None or report.running or not answered:
        return None
    return JobAbsent(report.job, "it running", tuple(answered), asked, source)


@handle_errors
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
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
    accept_new_host_keys: AcceptNewOpt = False,
    parallel: ParallelOpt = 64,
    connect_timeout: ConnectTimeoutOpt = 5.0,
) -> None:
    """Show every host of a running job, worst first, refreshed every --interval seconds: rank
    processes alive, steps/s and step time p50/p95 (the slowest rank's), GPU utilization,
    memory and power (nvidia-smi), CPU % and RSS of the job's processes, tx/rx on the
    interface NCCL/Gloo uses, and the age of the last output line. A host that cannot be
    reached, or whose nvidia-smi fails, is a row with its error. Exits 1 when a host gave no
    answer or the job runs nowhere (with --once or --json).

    \b
    Examples:
      ddpctl top job.toml                           # live table; Ctrl-C ends it
      ddpctl top myjob -i hosts.toml --once --json  # one sample, as JSON
    """
    if job is not None:
        require_job_file(job)
    side = _slurm(job, backend, login, inventory)
    with make_pool(ssh_config, known_hosts, accept_new_host_keys, parallel, connect_timeout) as pool:
        try:
            report, absent = _run(pool, side, job, inventory, interval, once or as_json, as_json)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
    raise typer.Exit(_exit_code(report, absent))


def _run(pool: HostPool, side: SlurmSide | None, job: str | None, inventory: Path | None, interval: float,
         once: bool, as_json: bool) -> tuple[TopReport, JobAbsent | None]:
    absent: JobAbsent | None = None
    if side is not None:
        client = slurm_client(pool, side.login, side.inventory)
        name = side.name or None

        def sample() -> TopReport:
            return collect_slurm(client, side.spec, name, interval)
    else:
        target, inv = resolve_target(job, inventory) if job is not None else (None, load_inventory_arg(inventory))
        session = TopSession(pool, inv.hosts, target, interval)
        sample = session.sample
    if as_json:
        report = sample()
        console.print_json(json.dumps(report.to_json()))
    else:
        report = show(sample, once)
    if side is None and report.job is not None:
        answered = [h.name for h in inv.hosts if h.name not in report.failed]
        absent = _absent(report, answered, len(inv.hosts), inv.source)
    return report, absent
