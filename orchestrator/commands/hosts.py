"""`ddpctl hosts`: the host ledger, one row per host (runs, last seen, faults, what it cost the runs
in the quarantine window, state), `--prom FILE` for node_exporter (orchestrator/hostops/prom.py), and
`--release HOST` after a repair (orchestrator/hostops/hostbook.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from inventory import ConfigError, Inventory, load_inventory
from orchestrator.commands.common import InventoryOpt, JsonOpt, console, err_console, handle_errors, ssh_flags, writing
from orchestrator.hostops.hostbook import HostRow, HostsView, Released, hosts_view, last_fault_text, release_host
from orchestrator.hostops.quarantine import LedgerState, duration
from orchestrator.remote.ssh_options import Connection

ReleaseOpt = Annotated[str | None, typer.Option(
    "--release", metavar="HOST", help="Release HOST (its name or address) from quarantine after a repair.")]
CheckOpt = Annotated[bool, typer.Option(
    "--check", help="With --release: run the deep checks on the host against hosts the ledger knows good, "
    "and release it only if they pass.")]
RunsDirOpt = Annotated[Path, typer.Option("--runs-dir", help="Where --check's logs go.")]
PromOpt = Annotated[Path | None, typer.Option(
    "--prom", metavar="FILE", dir_okay=False,
    help="Write each host's state, faults and cost to FILE (atomically) for node_exporter's textfile "
    "collector, and print one line instead of the table: see docs/metrics.md.")]
STATE_STYLE = {LedgerState.OK: "green", LedgerState.SUSPECT: "yellow", LedgerState.QUARANTINED: "bold red"}


@handle_errors
@ssh_flags()
def hosts_command(inventory: InventoryOpt = None, release: ReleaseOpt = None, as_json: JsonOpt = False,
                  *, connection: Connection, check: CheckOpt = False, runs_dir: RunsDirOpt = Path("runs"),
                  prom: PromOpt = None) -> None:
    """Every host's runs, faults and state: ok, suspect or quarantined.

    The host ledger on this machine records each doctor run and each `up` attempt: the hosts seen,
    each host lost, each host fault, hardware line and straggler, and the time each run lost to it
    (the cost column: within the quarantine window). A host with 2 host faults in 24 h (the
    inventory's quarantine_after, quarantine_window) is quarantined: `up` leaves it out.

    \b
    Examples:
      ddpctl hosts --prom /var/lib/prometheus/node-exporter/ddpctl-hosts.prom
      ddpctl hosts -i hosts.toml --release node1 --check   # back in, once it passes
    """
    inv = load_inventory(inventory) if inventory is not None else None
    if release is not None and prom is not None:
        raise ConfigError("--prom goes without --release", key="--prom",
                          hint="release first, then: ddpctl hosts --prom ddpctl-hosts.prom")
    if check:
        if release is None or inv is None:
            raise ConfigError("--check goes with --release HOST and -i <inventory>", key="--check",
                              hint="ddpctl hosts -i hosts.toml --release node3 --check")
        release_checked(inv, release, connection, runs_dir, as_json)
    if release is not None:
        print_released(release_host(inv, release), as_json)
        raise typer.Exit(0)
    view = hosts_view(inv)
    print_warnings(view.warnings)
    written = write_prom(prom, view) if prom is not None else None
    if as_json:
        console.print_json(json.dumps(view_json(view)))
    elif written is not None:
        console.print(escape(written))
    else:
        print_view(view)


def print_released(released: Released, as_json: bool) -> None:
    print_warnings(released.warnings)
    if as_json:
        console.print_json(json.dumps(released_json(released)))
    else:
        was = released.was
        console.print(escape(f"released {released.record.name} ({released.record.address}): it was "
                             f"{was.state.value}" + (f" ({was.reason})" if was.reason else "")
                             + "; its faults before now no longer count"))


def write_prom(path: Path, view: HostsView) -> str:
    """--prom FILE: the ledger's families, for node_exporter's textfile collector; the line that says so."""
    from orchestrator.hostops.prom import ledger_families, write_textfile  # prometheus-client: only when asked

    if path.suffix != ".prom":
        print_warnings([f"node_exporter's textfile collector reads only *.prom files, not {path.name}"])
    with writing(path, "--prom", "--prom /var/lib/prometheus/node-exporter/ddpctl-hosts.prom"):
        write_textfile(path, ledger_families(view))
    hosts = f"{len(view.rows)} host{'s' if len(view.rows) != 1 else ''}"
    return f"wrote {path}: the state, host faults and cost in {duration(view.policy.window)} of {hosts}"


def release_checked(inv: Inventory, name: str, connection: Connection, runs_dir: Path, as_json: bool) -> None:
    """--release HOST --check: the deep checks first; exit 0 released, 1 held."""
    from orchestrator.doctor.release import release_with_check

    def notice(text: str) -> None:
        if not as_json:
            err_console.print(f"[dim]hosts: {escape(text)}[/]")

    checked = release_with_check(inv, name, connection, runs_dir, notice=notice)
    print_warnings(list(checked.warnings) + (checked.released.warnings if checked.released else []))
    held = [{"check": f.check, "status": f.status.value, "host": f.host, "message": f.message}
            for f in checked.held_by]
    if as_json:
        console.print_json(json.dumps({"host": checked.host, "partners": list(checked.partners),
                                       "released": checked.passed, "held_by": held,
                                       "findings": [f.to_json() for f in checked.report.findings
                                                    if f.host == checked.host]}))
    elif checked.released is not None:
        was = checked.released.was
        console.print(escape(f"released {checked.host}: the deep checks passed against "
                             f"{', '.join(checked.partners)}; it was {was.state.value}"
                             + (f" ({was.reason})" if was.reason else "")))
    else:
        console.print(escape(f"{checked.host} is not released: the deep checks against "
                             f"{', '.join(checked.partners)} still name it:"))
        for f in checked.held_by:
            console.print(escape(f"  [{f.check}] {f.status.value}: {f.message}"))
    raise typer.Exit(0 if checked.passed else 1)


def print_warnings(warnings: list[str]) -> None:
    for warning in warnings:
        err_console.print(f"[yellow]warning:[/] {escape(warning)}")


def released_json(released: Released) -> dict[str, object]:
    return {"released": released.record.name, "address": released.record.address,
            "was": released.was.state.value, "reason": released.was.reason, "warnings": released.warnings}


def view_json(view: HostsView) -> dict[str, object]:
    policy = view.policy
    return {"ledger": view.path, "quarantine": {"enabled": policy.enabled, "after": policy.after,
                                                "window_s": policy.window},
            "hosts": [row.to_json() for row in view.rows], "warnings": view.warnings}


def when(at: float | None) -> str:
    return "never" if at is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(at))


def faults_cell(row: HostRow) -> str:
    counts = ", ".join(f"{kind} {n}" for kind, n in sorted(row.counts.items()))
    last = last_fault_text(row)
    return "-" if not counts else f"{counts}; last {last}"


def print_view(view: HostsView) -> None:
    """One row per host; each host not ok with its reason below the table."""
    if not view.rows:
        console.print(escape(f"no host in the ledger yet ({view.path}): `ddpctl doctor` and `ddpctl up` fill it"))
        return
    table = Table("host", "address", "runs", "last seen", "faults", f"cost {duration(view.policy.window)}", "mtbf",
                  "state", box=None, pad_edge=False)
    for row in view.rows:
        r, j = row.record, row.judgement
        mtbf = duration(round(j.mtbf)) if j.mtbf is not None else "-"
        table.add_row(escape(r.name), escape(r.address), str(r.runs), when(r.last_seen), escape(faults_cell(row)),
                      row.cost.text(), mtbf, f"[{STATE_STYLE[j.state]}]{j.state.value}[/]")
    console.print(table)
    for row in view.rows:
        if row.judgement.state is LedgerState.QUARANTINED:
            console.print(escape(f"{row.record.name}: quarantined ({row.judgement.reason}); release it with: "
                                 f"ddpctl hosts --release {row.record.name}"))
        elif row.judgement.state is LedgerState.SUSPECT:
            console.print(escape(f"{row.record.name}: suspect ({row.judgement.reason})"))
    console.print(escape(f"ledger: {view.path}"), style="dim")

