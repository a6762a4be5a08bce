"""`ddpctl ps`, `down` and `logs`: jobs on every host, found through each host's run state."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from inventory import ConfigError, Inventory, load_job
from inventory.slurm import SlurmSpec
from orchestrator.commands.common import (
    AcceptNewOpt,
    BackendChoice,
    GraceOpt,
    InventoryOpt,
    JsonOpt,
    KnownHostsOpt,
    ParallelOpt,
    SshConfigOpt,
    console,
    err_console,
    handle_errors,
    load_inventory_arg,
    print_host_error,
)
from orchestrator.errors import HostError
from orchestrator.hostops import slurm_jobs
from orchestrator.hostops.jobs import (
    JobAbsent,
    down_absent,
    job_logs,
    logs_absent,
    running_jobs,
    stop_job,
)
from orchestrator.remote.pool import make_pool
from orchestrator.remote.slurm import ACTIVE_STATES, QueuedJob, SlurmClient, slurm_client
from orchestrator.remote.wire import LogLine

JobArg = Annotated[str, typer.Argument(help="A job id (or name), or the job.toml it was started from.")]
BackendOpt = Annotated[BackendChoice | None, typer.Option(
    "--backend", help="slurm: jobs submitted to Slurm (default: a job.toml with \\[slurm] says so; else ssh).")]
LoginOpt = Annotated[str | None, typer.Option(
    "--login", help="With --backend slurm: run Slurm's commands on this login node over SSH.")]


@dataclass(frozen=True)
class SlurmSide:
    """Where a Slurm job's commands run, when the target is a Slurm job (and how its nodes start)."""

    name: str  # what the user named: a Slurm job id, a ddpctl job id, or the job file's job name
    login: str | None
    inventory: Inventory
    spec: SlurmSpec


def require_job_file(job: str) -> None:
    """A job argument that reads as a path (`*.toml`, or with a `/`) must exist: it is not a job id."""
    if (job.endswith(".toml") or "/" in job) and not Path(job).exists():
        raise ConfigError(f"job file {job} does not exist",
                          hint="give the job.toml the job was started from, or its job id: "
                               "`ddpctl ps` lists running jobs and their ids")


def slurm_side(job: str, backend: BackendChoice | None, login: str | None) -> SlurmSide | None:
    """A job.toml with [slurm] (unless --backend ssh), or --backend slurm: the Slurm side."""
    if backend is BackendChoice.ssh:
        return None
    spec = load_job(Path(job)) if job.endswith(".toml") and Path(job).exists() else None
    if spec is not None and spec.slurm is not None:
        return SlurmSide(spec.name, login or spec.slurm.login, spec.inventory, spec.slurm)
    if backend is BackendChoice.slurm:
        return SlurmSide(spec.name if spec else job, login, load_inventory_arg(None), SlurmSpec(login=login))
    return None


def slurm_target(client: SlurmClient, side: SlurmSide) -> slurm_jobs.SlurmTarget:
    target = slurm_jobs.find(client, side.name)
    if target is None:
        raise slurm_jobs.not_found(client, side.name)
    return target


def resolve_target(job: str, inventory_path: Path | None) -> tuple[str, Inventory]:
    """A job.toml names the job and its inventory; a bare id needs -i (or means this machine).
    A *.toml path that exists but is no file (a directory) is loaded too, to say so."""
    if job.endswith(".toml") and Path(job).exists():
        spec = load_job(Path(job))
        inv = load_inventory_arg(inventory_path) if inventory_path else spec.inventory
        return spec.name, inv
    return job, load_inventory_arg(inventory_path)


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
def ps_command(
    inventory: InventoryOpt = None,
    backend: BackendOpt = None,
    login: LoginOpt = None,
    job: Annotated[str | None, typer.Option("--job", help="Only this job id or name.")] = None,
    as_json: JsonOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
    accept_new_host_keys: AcceptNewOpt = False,
    parallel: ParallelOpt = 64,
) -> None:
    """List ddpctl jobs running on each host: job id, node rank, pids, uptime, GPU memory; and,
    where Slurm's client is configured here (or with --backend slurm), ddpctl's jobs in its queue.

    \b
    Examples:
      ddpctl ps -i hosts.toml           # ddpctl jobs on the inventory's hosts
      ddpctl ps --backend slurm --json  # ddpctl's jobs in Slurm's queue, as JSON
    """
    inv = load_inventory_arg(inventory)
    if backend is BackendChoice.slurm:
        with make_pool(ssh_config, known_hosts, accept_new_host_keys, parallel) as pool:
            queued = slurm_jobs.ddpctl_jobs(slurm_client(pool, login, inv))
        print_slurm_jobs(queued, job, as_json)
        raise typer.Exit(0)
    slurm: list[QueuedJob] | None = None
    slurm_error: HostError | None = None
    with make_pool(ssh_config, known_hosts, accept_new_host_keys, parallel) as pool:
        fan = running_jobs(pool, inv.hosts, job)
        if backend is None and slurm_jobs.configured_here():
            try:
                slurm = slurm_jobs.ddpctl_jobs(slurm_client(pool, login, inv))
            except HostError as err:
                slurm_error = err
    rows = [j for h in inv.names() if h in fan.succeeded for j in fan.succeeded[h]]
    queued = [j for j in slurm or [] if slurm_match(j, job)]
    if as_json:
        data: dict[str, object] = {"jobs": [r.to_json() for r in rows],
                                   "failed": {k: v.to_json() for k, v in fan.failed.items()}}
        if slurm is not None or slurm_error is not None:
            data["slurm_jobs"] = [slurm_row(j) for j in queued]
            data["slurm_error"] = slurm_error.to_json() if slurm_error else None
        console.print_json(json.dumps(data))
    else:
        table = Table("host", "job id", "node rank", "pids", "uptime", "GPU MiB", "detached")
        for r in rows:
            gpu = "-" if r.gpu_memory_mib is None else str(r.gpu_memory_mib)
            table.add_row(r.host, r.job_id, str(r.node_rank), " ".join(map(str, r.pids)),
                          f"{r.uptime_s:.0f}s", gpu, "yes" if r.detached else "no")
        if rows:
            console.print(table)
        if queued:
            console.print(slurm_table(queued))
        if not rows and not queued:
            console.print("no ddpctl jobs running" + (" (nor in Slurm's queue)" if slurm is not None else ""))
        report_failures(fan.failed)
        if slurm_error is not None:
            print_host_error(slurm_error)
    raise typer.Exit(1 if fan.failed else 0)


def slurm_match(j: QueuedJob, only: str | None) -> bool:
    return only is None or only in (j.job_id, j.name) or j.name.startswith(f"{only}-")


def slurm_row(j: QueuedJob) -> dict[str, str]:
    return {"slurm_job_id": j.job_id, "job_id": j.name, "state": j.state, "reason": j.reason, "nodes": j.nodes,
            "elapsed": j.elapsed}


def slurm_table(rows: list[QueuedJob]) -> Table:
    table = Table("Slurm job", "job id", "state", "nodes", "elapsed", "reason")
    for j in rows:
        table.add_row(j.job_id, j.name, j.state, j.nodes, j.elapsed, "" if j.reason == "None" else j.reason)
    return table


def print_slurm_jobs(queued: list[QueuedJob], only: str | None, as_json: bool) -> None:
    rows = [j for j in queued if slurm_match(j, only)]
    if as_json:
        console.print_json(json.dumps({"jobs": [slurm_row(j) for j in rows]}))
        return
    console.print(slurm_table(rows) if rows else "no ddpctl jobs in Slurm's queue")


@handle_errors
def down_command(
    job: JobArg,
    inventory: InventoryOpt = None,
    backend: BackendOpt = None,
    login: LoginOpt = None,
    grace: GraceOpt = 10.0,
    as_json: JsonOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
    accept_new_host_keys: AcceptNewOpt = False,
    parallel: ParallelOpt = 64,
) -> None:
    """Stop a job on every host, from any machine, and report what was killed.

    \b
    Examples:
      ddpctl down job.toml                        # stop what job.toml started
      ddpctl down myjob -i hosts.toml --grace 30  # by id; 30 s before SIGKILL
    """
    require_job_file(job)
    side = slurm_side(job, backend, login)
    if side is not None:
        with make_pool(ssh_config, known_hosts, accept_new_host_keys, parallel) as pool:
            client = slurm_client(pool, side.login, side.inventory)
            found = slurm_target(client, side)
            if found.slurm_id is None or found.state not in ACTIVE_STATES:
                raise slurm_jobs.not_found(client, f"{found.job_id} running")
            state = slurm_jobs.cancel(client, found)
        console.print(f"cancelled Slurm job {found.slurm_id} ({found.job_id}): {state}", markup=False)
        raise typer.Exit(0)
    target, inv = resolve_target(job, inventory)
    with make_pool(ssh_config, known_hosts, accept_new_host_keys, parallel) as pool:
        fan = stop_job(pool, inv.hosts, target, grace)
    absent = down_absent(target, inv, fan)
    if as_json:
        console.print_json(json.dumps({"stopped": {h: [s.to_json() for s in v] for h, v in fan.succeeded.items()},
                                       "failed": {k: v.to_json() for k, v in fan.failed.items()}}))
    else:
        for host, stopped in fan.succeeded.items():
            for s in stopped:
                forced = f", {len(s.killed)} needed SIGKILL" if s.killed else ""
                console.print(f"{host}: stopped {s.job_id}: {len(s.terminated)} process(es){forced}",
                              markup=False)
                for pid, cmd in s.commands.items():
                    console.print(f"  pid {pid}: {cmd[:100]}", markup=False)
        report_failures(fan.failed)
    if absent is not None:
        report_absent(absent)
    raise typer.Exit(1 if fan.failed or absent is not None else 0)


@handle_errors
def logs_command(
    job: JobArg,
    inventory: InventoryOpt = None,
    backend: BackendOpt = None,
    login: LoginOpt = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming until the job ends.")] = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
    accept_new_host_keys: AcceptNewOpt = False,
    parallel: ParallelOpt = 64,
) -> None:
    """Replay (or follow) every host's output of a job: each line labelled with its host and rank,
    the hosts' lines merged by time (with --follow: as they arrive).

    \b
    Examples:
      ddpctl logs job.toml -f          # follow every host's output to the end
      ddpctl logs myjob -i hosts.toml  # replay a job's output by its id
    """
    require_job_file(job)
    side = slurm_side(job, backend, login)
    if side is not None:
        lock = threading.Lock()

        def show(host: str, line: str) -> None:  # Slurm's nodes: prefixed by node, as they come
            with lock:
                console.print(Text(f"[{host}] ", style="cyan") + Text(line), highlight=False)

        with make_pool(ssh_config, known_hosts, accept_new_host_keys, parallel) as pool:
            client = slurm_client(pool, side.login, side.inventory)
            slurm_jobs.logs(client, slurm_target(client, side), follow, show)
        raise typer.Exit(0)
    target, inv = resolve_target(job, inventory)
    with make_pool(ssh_config, known_hosts, accept_new_host_keys, parallel) as pool:
        fan = job_logs(pool, inv.hosts, target, follow, print_log_lines)
    report_failures(fan.failed)
    absent = logs_absent(target, inv, fan)
    if absent is not None:
        report_absent(absent)
    found = any(logs.found for logs in fan.succeeded.values())
    raise typer.Exit(0 if found and not fan.failed else 1)
