"""`ddpctl sync job.toml`: what `up` does first with [sync], without launching."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.text import Text

from inventory import JobOverrides, load_job
from orchestrator.commands.common import JsonOpt, console, err_console, handle_errors, print_host_error, ssh_flags
from orchestrator.commands.sync_view import SyncView
from orchestrator.remote.pool import make_pool
from orchestrator.remote.ssh_options import Connection
from orchestrator.sizes import size_text
from orchestrator.sync.core import Progress, SyncEvent, SyncReport, sync_job
from orchestrator.sync.units import count_text


@handle_errors
@ssh_flags()
def sync_command(
    job_file: Annotated[Path, typer.Argument(help="The job file; its \\[sync] table says what goes where.",
                                             show_default=False)],
    hosts: Annotated[str | None, typer.Option("--hosts", help="Comma-separated subset of the job's hosts.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would change on each host; change "
                                          "nothing.")] = False,
    runs_dir: Annotated[Path, typer.Option("--runs-dir", help="ddpctl up's runs directory: never sent, where it "
                                           "lies inside the source.")] = Path("runs"),
    as_json: JsonOpt = False,
    *,
    connection: Connection,
) -> None:
    """Copy the job's source to every host (only what changed).

    Every host's copy is made to match this machine's.

    \b
    Examples:
      ddpctl sync job.toml --dry-run            # what would change on each host
      ddpctl sync job.toml --hosts node0,node1  # only these two hosts
    """
    job = load_job(job_file, JobOverrides(hosts=(hosts,) if hosts else None, backend="ssh"))
    with make_pool(connection) as pool:
        keep_out = (runs_dir,)
        if as_json:
            report = sync_job(job, pool, dry_run=dry_run, keep_out=keep_out)
            console.print_json(json.dumps(report.to_json()))
        else:
            report = _run_with_progress(lambda tell: sync_job(job, pool, tell, dry_run=dry_run, keep_out=keep_out))
            _summary(report, dry_run)
    raise typer.Exit(0 if report.ok else 1)


def _run_with_progress(run: Callable[[Progress], SyncReport]) -> SyncReport:
    view = SyncView(live=err_console.is_terminal)

    def tell(event: SyncEvent) -> None:
        line = view.update(event)
        if line is not None:
            err_console.print(Text(f"ddpctl: {line}"))

    if not err_console.is_terminal:
        return run(tell)
    with Live(get_renderable=view.status, console=err_console, refresh_per_second=8, transient=True):
        return run(tell)


def _summary(report: SyncReport, dry_run: bool) -> None:
    for err in report.failed.values():
        print_host_error(err)
    if report.skipped_links:
        err_console.print(f"ddpctl: not followed (symlinks to directories): {', '.join(report.skipped_links)}",
                          markup=False)
    synced = report.synced.values()
    sent = sum(len(r.changes.send) for r in synced)
    sent_bytes = sum(r.changes.send_bytes for r in synced)
    removed = sum(len(r.changes.remove) for r in synced)
    conflicts = sum(len(r.changes.conflicts) for r in synced)
    verb, remove_verb = ("would send", "would remove") if dry_run else ("sent", "removed")
    kept = f"; {count_text(conflicts, 'path')} kept as the host's (listed above)" if conflicts else ""
    err_console.print(f"ddpctl: {report.source}: {count_text(report.files, 'file')} "
                      f"({size_text(report.total_bytes)}); {len(report.synced)} host(s) ok, {len(report.failed)} "
                      f"failed; {verb} {count_text(sent, 'file')} ({size_text(sent_bytes)}), {remove_verb} "
                      f"{removed} in all{kept}", markup=False)
