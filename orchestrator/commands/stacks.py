"""`ddpctl stacks`: every rank's Python stack, identical ones collapsed, the odd one out first."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from orchestrator.commands.common import (
    AcceptNewOpt,
    InventoryOpt,
    JsonOpt,
    KnownHostsOpt,
    ParallelOpt,
    SshConfigOpt,
    console,
    handle_errors,
)
from orchestrator.commands.lifecycle import (
    BackendOpt,
    JobArg,
    LoginOpt,
    print_error,
    report_absent,
    require_job_file,
    resolve_target,
    slurm_side,
    slurm_target,
)
from orchestrator.hostops import slurm_jobs
from orchestrator.hostops.jobs import JobAbsent
from orchestrator.hostops.stacks import (
    StacksReport,
    collect,
    groups_text,
    report_json,
    stacks_absent,
    verdict_text,
)
from orchestrator.remote.pool import make_pool
from orchestrator.remote.slurm import slurm_client


@handle_errors
def stacks_command(
    job: JobArg,
    inventory: InventoryOpt = None,
    backend: BackendOpt = None,
    login: LoginOpt = None,
    frames: Annotated[int, typer.Option("--frames", min=1, help="Frames shown per group.")] = 8,
    as_json: JsonOpt = False,
    ssh_config: SshConfigOpt = None,
    known_hosts: KnownHostsOpt = None,
    accept_new_host_keys: AcceptNewOpt = False,
    parallel: ParallelOpt = 64,
) -> None:
    """Dump the Python stack of every rank of a running job, grouped, and name the collective it waits in.

    Each rank's stack and its flight recorder's last collectives come from ddpctl's rank wrapper
    (py-spy for a rank that cannot answer).

    \b
    Examples:
      ddpctl stacks myjob -i hosts.toml           # where each rank is now
      ddpctl stacks myjob --backend slurm --json  # a Slurm job's ranks, as JSON
    """
    require_job_file(job)
    side = slurm_side(job, backend, login)
    absent: JobAbsent | None = None
    with make_pool(ssh_config, known_hosts, accept_new_host_keys, parallel) as pool:
        if side is not None:
            client = slurm_client(pool, side.login, side.inventory)
            report = slurm_jobs.stacks(client, slurm_target(client, side), side.spec)
        else:
            target, inv = resolve_target(job, inventory)
            report = collect(pool, inv.hosts, target)
            absent = stacks_absent(report, inv)
    if as_json:
        console.print_json(json.dumps(report_json(report)))
    else:
        for line in [*verdict_text(report), *groups_text(report, frames)]:
            console.print(line, markup=False, highlight=False)
        report_errors(report)
    if absent is not None:
        report_absent(absent)
    elif not report.groups and not report.host_errors:
        print_error(f"job {report.job}: no rank of it is running on its nodes",
                    "check the job id: `ddpctl ps --backend slurm` lists the running ones")
    raise typer.Exit(0 if report.groups and not report.host_errors else 1)


def report_errors(report: StacksReport) -> None:
    """Each host that gave no stacks (unreachable, py-spy missing, ...): what and the fix."""
    for host, message in report.host_errors.items():
        print_error(f"{host}: {message}", report.host_fixes.get(host))
