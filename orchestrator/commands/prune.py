"""`ddpctl prune`: the flags, one call into hostops/prune.py, and a line per host of what it
removed (or, with --dry-run, would remove)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from orchestrator.commands.common import (
    InventoryOpt,
    JsonOpt,
    console,
    err_console,
    handle_errors,
    print_host_error,
    ssh_flags,
)
from orchestrator.hostops.prune import HERE, PruneOutcome, names_text, prune_for, prune_target, summary
from orchestrator.hostops.runrecord import DEFAULT_RUNS_DIR
from orchestrator.remote.pool import make_pool
from orchestrator.remote.ssh_options import Connection

JobFileArg = Annotated[str | None, typer.Argument(
    help="The job.toml whose hosts to prune (its inventory); none: -i's hosts, else this machine.",
    show_default=False)]
KeepOpt = Annotated[int | None, typer.Option(
    "--keep", min=0, help="Runs to keep on each host (default: the inventory's [defaults] keep_runs, else 50).")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Say what would be removed; remove nothing.")]
RunsDirOpt = Annotated[Path, typer.Option("--runs-dir", help="Where `up` kept its runs on this machine.")]


@handle_errors
@ssh_flags()
def prune_command(
    job: JobFileArg = None,
    inventory: InventoryOpt = None,
    keep: KeepOpt = None,
    dry_run: DryRunOpt = False,
    runs_dir: RunsDirOpt = DEFAULT_RUNS_DIR,
    as_json: JsonOpt = False,
    *,
    connection: Connection,
) -> None:
    """Remove the oldest run directories, on every host and here.

    Keeps the newest runs (--keep, else the inventory's keep_runs) in ~/.ddpctl/runs on each host
    and in runs/ here; never a run that may still run, nor a directory ddpctl did not write.
    `ddpctl up` does the same before each launch.

    \b
    Examples:
      ddpctl prune -i hosts.toml --dry-run  # what would go, host by host
      ddpctl prune job.toml --keep 10       # the 10 newest runs stay
    """
    target = prune_target(job, inventory, keep)
    with make_pool(connection) as pool:
        outcome = prune_for(target, pool, runs_dir, dry_run)
    if as_json:
        console.print_json(json.dumps(outcome_json(outcome)))
    else:
        print_outcome(outcome, target.slurm)
    failed = outcome.failed or any(r.errors for r in outcome.reports.values())
    raise typer.Exit(1 if failed else 0)


def outcome_json(outcome: PruneOutcome) -> dict[str, object]:
    return {"keep": outcome.keep, "hosts": {h: asdict(r) for h, r in outcome.reports.items()},
            "failed": {h: e.to_json() for h, e in outcome.failed.items()}}


def print_outcome(outcome: PruneOutcome, slurm: bool) -> None:
    """One line per host: what went (its names), or that nothing had to."""
    for host, report in outcome.reports.items():
        line = summary(host, report)
        where = f"here ({report.root})" if host == HERE else host
        if line is None:
            console.print(escape(f"{where}: nothing to prune ({report.kept} run(s), keeping {outcome.keep})"))
        else:
            console.print(escape(f"{line}: {names_text(report)}"))
        for error in report.errors:
            err_console.print(f"[bold red]error:[/] {escape(where)}: could not remove {escape(error)}")
    if slurm:
        console.print("Slurm's job directories on the cluster are left alone (docs/running.md, \"Run directories\")")
    for err in outcome.failed.values():
        print_host_error(err)
