"""`ddpctl doctor`: check every host in parallel and print a hosts × checks table and findings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from inventory import ConfigError, JobOverrides, load_job
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
    make_pool,
)
from orchestrator.doctor import DoctorContext, run_doctor
from orchestrator.doctor.context import from_inventory, from_job
from orchestrator.doctor.render import render, to_json
from orchestrator.hosts import DEFAULT_PARALLEL

JobArg = Annotated[Path | None, typer.Argument(help="Job file (job.toml); its hosts, env and "
                                               "rendezvous are checked.", dir_okay=False)]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Warnings count as errors (exit 1).")]
MasterPortOpt = Annotated[int | None, typer.Option("--master-port", min=1, max=65535,
                                                   help="Master port to check (default: the "
                                                   "job's, else 29500).")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Re-import torch on every host "
                                          "instead of reusing its cached facts.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", min=1.0,
                                           help="Seconds for each host's facts round trip.")]


def build_context(job_file: Path | None, inventory: Path | None, master_port: int | None,
                  timeout: float, use_cache: bool = True) -> DoctorContext:
    if job_file is not None and inventory is not None:
        raise ConfigError("give a job file or --inventory, not both", key="--inventory",
                          hint="the job file names its inventory; drop -i")
    if job_file is not None:
        if not job_file.is_file():
            raise ConfigError(f"job file {job_file} does not exist", file=job_file,
                              hint="pass the path of a job.toml")
        overrides = JobOverrides(master_port=master_port) if master_port else None
        return from_job(load_job(job_file, overrides), master_port, timeout, use_cache)
    return from_inventory(load_inventory_arg(inventory), master_port, timeout, use_cache)


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
) -> None:
    """Check every host (SSH, torch, versions, firewall, ports, NCCL/Gloo interfaces, DNS, clock).

    Exit 0 with no errors, 1 with any (--strict: or warnings), 2 for bad input.
    """
    ctx = build_context(job_file, inventory, master_port, timeout, not no_cache)
    pool = make_pool(ssh_config, known_hosts, accept_new, parallel, connect_timeout)

    def notice(text: str) -> None:
        if not json_out:
            err_console.print(f"[dim]doctor: {text}[/]")

    with pool:
        report = run_doctor(ctx, pool, notice)
    if json_out:
        typer.echo(to_json(report, strict))
    else:
        render(report, console, strict)
    raise typer.Exit(report.exit_code(strict))
