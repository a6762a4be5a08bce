"""`ddpctl ps`, `down` and `logs`: the flags, one call into hostops/control.py (a job's hosts, or
Slurm), and the rendering of its result."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from orchestrator.commands.common import (
    BackendChoice,
    GraceOpt,
    InventoryOpt,
    JsonOpt,
    console,
    err_console,
    handle_errors,
    print_host_error,
    ssh_flags,
)
from orchestrator.errors import HostError
from orchestrator.hostops.control import Cancelled, Listing, Stopped, job_control
from orchestrator.hostops.jobs import JobAbsent
from orchestrator.hostops.targets import BackendName
from orchestrator.remote.slurm_client import QueuedJob
from orchestrator.remote.ssh_options import Connection
from orchestrator.remote.wire import LogLine

JobArg = Annotated[str, typer.Argument(help="A job id (or name), or the job.toml it was started from.")]
BackendOpt = Annotated[BackendChoice | None, typer.Option(
    "--backend", help="slurm: jobs submitted to Slurm (default: a job.toml with \\[slurm] says so; else ssh).")]
LoginOpt = Annotated[str | None, typer.Option(
    "--login", help="With --backend slurm: run Slurm's commands on this login node over SSH.")]


def backend_name(backend: BackendChoice | None) -> BackendName | None:
    return "slurm" if backend is BackendChoice.slurm else "ssh" if backend is BackendChoice.ssh else None


def report_failures(failed: Mapping[str, HostError]) -> None:
    for err in failed.values():
        print_host_error(err)


def print_error(message: str, fix: str | None) -> None:
    """The usual `error:` line and, where known, its `fix:` line."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    if fix:
        err_console.print(f"  [bold]fix:[/] {escape(fix)}", highlight=False)


def report_absent(absent: JobAbsent) -> None:
    print_error(absent.message, absent.fix)


def print_log_lines(lines: Sequence[LogLine]) -> None:
    """`[host:rank] text` per line, the label coloured on a terminal; written straight to stdout
    elsewhere (a job's log can be millions of lines)."""
    if console.is_terminal:
        for line in lines:
            console.print(Text(f"[{line.label}] ", style="cyan") + Text(line.text), highlight=False)
        return
    out = console.file
    out.write("".join(f"[{line.label}] {line.text}\n" for line in lines))
    out.flush()


@handle_errors
@ssh_flags(connect_timeout=None)
def ps_command(
    inventory: InventoryOpt = None,
    backend: BackendOpt = None,
    login: LoginOpt = None,
    job: Annotated[str | None, typer.Option("--job", help="Only this job id or name.")] = None,
    as_json: JsonOpt = False,
    *,
    connection: Connection,
) -> None:
    """List ddpctl jobs running on each host and in Slurm's queue.

    Each job: job id, node rank, pids, uptime, GPU memory; and, where Slurm's client is
    configured here (or with --backend slurm), ddpctl's jobs in its queue.

    \b
    Examples:
      ddpctl ps -i hosts.toml           # ddpctl jobs on the inventory's hosts
      ddpctl ps --backend slurm --json  # ddpctl's jobs in Slurm's queue, as JSON
    """
    with job_control(connection, None, backend_name(backend), login, inventory, lookup=job) as control:
        listing = control.ps(job)
    if listing.queue_only:
        print_slurm_jobs(listing.queued or [], as_json)
    elif as_json:
        console.print_json(json.dumps(listing_json(listing)))
    else:
        print_listing(listing)
    raise typer.Exit(1 if listing.failed else 0)


def listing_json(listing: Listing) -> dict[str, object]:
    data: dict[str, object] = {"jobs": [r.to_json() for r in listing.jobs],
                               "failed": {k: v.to_json() for k, v in listing.failed.items()}}
    if listing.queued is not None or listing.queue_error is not None:
        data["slurm_jobs"] = [slurm_row(j) for j in listing.queued or []]
        data["slurm_error"] = listing.queue_error.to_json() if listing.queue_error else None
    return data


def print_listing(listing: Listing) -> None:
    """The hosts' jobs, then Slurm's queue where it was asked; the hosts that failed."""
    table = Table("host", "job id", "node rank", "pids", "uptime", "GPU MiB", "detached")
    for r in listing.jobs:
        gpu = "-" if r.gpu_memory_mib is None else str(r.gpu_memory_mib)
        table.add_row(r.host, r.job_id, str(r.node_rank), " ".join(map(str, r.pids)),
                      f"{r.uptime_s:.0f}s", gpu, "yes" if r.detached else "no")
    if listing.jobs:
        console.print(table)
    if listing.queued:
        console.print(slurm_table(listing.queued))
    if not listing.jobs and not listing.queued:
        nor = " (nor in Slurm's queue)" if listing.queued is not None else ""
        console.print("no ddpctl jobs running" + nor)
    report_failures(listing.failed)
    if listing.queue_error is not None:
        print_host_error(listing.queue_error)


def slurm_row(j: QueuedJob) -> dict[str, str]:
    return {"slurm_job_id": j.job_id, "job_id": j.name, "state": j.state, "reason": j.reason, "nodes": j.nodes,
            "elapsed": j.elapsed}


def slurm_table(rows: list[QueuedJob]) -> Table:
    table = Table("Slurm job", "job id", "state", "nodes", "elapsed", "reason")
    for j in rows:
        table.add_row(j.job_id, j.name, j.state, j.nodes, j.elapsed, "" if j.reason == "None" else j.reason)
    return table


def print_slurm_jobs(rows: list[QueuedJob], as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps({"jobs": [slurm_row(j) for j in rows]}))
        return
    console.print(slurm_table(rows) if rows else "no ddpctl jobs in Slurm's queue")


@handle_errors
@ssh_flags(connect_timeout=None)
def down_command(
    job: JobArg,
    inventory: InventoryOpt = None,
    backend: BackendOpt = None,
    login: LoginOpt = None,
    grace: GraceOpt = 10.0,
    as_json: JsonOpt = False,
    *,
    connection: Connection,
) -> None:
    """Stop a job on every host and report what was killed.

    It works from any machine that reaches the hosts.

    \b
    Examples:
      ddpctl down job.toml                        # stop what job.toml started
      ddpctl down myjob -i hosts.toml --grace 30  # by id; 30 s before SIGKILL
    """
    with job_control(connection, job, backend_name(backend), login, inventory) as control:
        outcome = control.down(grace)
    if isinstance(outcome, Cancelled):
        console.print(f"cancelled Slurm job {outcome.slurm_id} ({outcome.job_id}): {outcome.state}", markup=False)
        raise typer.Exit(0)
    if as_json:
        console.print_json(json.dumps({"stopped": {h: [s.to_json() for s in v] for h, v in outcome.stopped.items()},
                                       "failed": {k: v.to_json() for k, v in outcome.failed.items()}}))
    else:
        print_stopped(outcome)
    if outcome.absent is not None:
        report_absent(outcome.absent)
    raise typer.Exit(1 if outcome.failed or outcome.absent is not None else 0)


def print_stopped(outcome: Stopped) -> None:
    for host, stopped in outcome.stopped.items():
        for s in stopped:
            forced = f", {len(s.killed)} needed SIGKILL" if s.killed else ""
            console.print(f"{host}: stopped {s.job_id}: {len(s.terminated)} process(es){forced}", markup=False)
            for pid, cmd in s.commands.items():
                console.print(f"  pid {pid}: {cmd[:100]}", markup=False)
    report_failures(outcome.failed)


@handle_errors
@ssh_flags(connect_timeout=None)
def logs_command(
    job: JobArg,
    inventory: InventoryOpt = None,
    backend: BackendOpt = None,
    login: LoginOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming until the job ends.")] = False,
    *,
    connection: Connection,
) -> None:
    """Replay (or follow) a job's output from every host, by time.

    Each line is labelled with its host and rank, the hosts' lines merged by time (with --follow:
    as they arrive).

    \b
    Examples:
      ddpctl logs job.toml -f          # follow every host's output to the end
      ddpctl logs myjob -i hosts.toml  # replay a job's output by its id
    """
    with job_control(connection, job, backend_name(backend), login, inventory) as control:
        replayed = control.logs(follow, print_log_lines)
    report_failures(replayed.failed)
    if replayed.absent is not None:
        report_absent(replayed.absent)
    raise typer.Exit(0 if replayed.found and not replayed.failed else 1)
