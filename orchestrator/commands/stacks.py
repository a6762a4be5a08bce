"""`ddpctl stacks`: every rank's Python stack, identical ones collapsed, the odd one out first."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from orchestrator.commands.common import InventoryOpt, JsonOpt, console, handle_errors, ssh_flags
from orchestrator.commands.lifecycle import BackendOpt, JobArg, LoginOpt, backend_name, print_error, report_absent
from orchestrator.hostops.control import job_control
from orchestrator.hostops.stacks import StacksReport, groups_text, report_json, verdict_text
from orchestrator.remote.ssh_options import Connection


@handle_errors
@ssh_flags(connect_timeout=None)
def stacks_command(
    job: JobArg,
    inventory: InventoryOpt = None,
    backend: BackendOpt = None,
    login: LoginOpt = None,
    frames: Annotated[int, typer.Option("--frames", min=1, help="Frames shown per group.")] = 8,
    as_json: JsonOpt = False,
    *,
    connection: Connection,
) -> None:
    """Dump every rank's stack and name the collective it waits in.

    The ranks' Python stacks, grouped.

    Each rank's stack and its flight recorder's last collectives come from ddpctl's rank wrapper
    (py-spy for a rank that cannot answer).

    \b
    Examples:
      ddpctl stacks myjob -i hosts.toml           # where each rank is now
      ddpctl stacks myjob --backend slurm --json  # a Slurm job's ranks, as JSON
    """
    with job_control(connection, job, backend_name(backend), login, inventory) as control:
        report = control.stacks()
    if as_json:
        console.print_json(json.dumps(report_json(report)))
    else:
        for line in [*verdict_text(report), *groups_text(report, frames)]:
            console.print(line, markup=False, highlight=False)
        report_errors(report)
    if report.absent is not None:
        report_absent(report.absent)
    elif not report.groups and not report.host_errors:
        print_error(f"job {report.job}: no rank of it is running on its nodes",
                    "check the job id: `ddpctl ps --backend slurm` lists the running ones")
    raise typer.Exit(0 if report.groups and not report.host_errors else 1)


def report_errors(report: StacksReport) -> None:
    """Each host that gave no stacks (unreachable, py-spy missing, ...): what and the fix."""
    for host, message in report.host_errors.items():
        print_error(f"{host}: {message}", report.host_fixes.get(host))
