"""`ddpctl kill-port`: show who holds a port (here or on hosts), confirm, kill the tree, verify."""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from inventory import LOCALHOST, ConfigError, Host
from orchestrator.commands.common import (
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
from orchestrator.hostops.killport import find_port_owners, free_port
from orchestrator.hostops.targets import inventory_at
from orchestrator.remote.pool import make_pool
from orchestrator.remote.ssh_options import Connection
from orchestrator.remote.wire import PortOwner, PortReport

PortArg = Annotated[int, typer.Argument(min=1, max=65535, help="The port to free (1-65535).", show_default=False)]


def select_hosts(inventory: Path | None, names: list[str] | None, all_hosts: bool) -> list[Host]:
    """This machine by default; else the named (or all) inventory hosts, each once. Without an
    inventory a named host is reached as `ssh NAME` reaches it (ssh_config applies), so the fix that
    doctor and `up` print for a held master port runs as printed."""
    if not names and not all_hosts:
        return [LOCALHOST]
    if inventory is None:
        if all_hosts:
            raise ConfigError("--all needs an inventory", key="--inventory", hint="pass -i hosts.toml (or a hostfile)")
        return [Host(name=name, address=name) for name in dict.fromkeys(names or [])]
    inv = inventory_at(inventory)
    if all_hosts:
        return list(inv.hosts)
    hosts = []
    for name in names or []:
        host = inv.get(name)
        if host is None:
            close = difflib.get_close_matches(name, inv.names(), n=3)
            raise ConfigError(f"host {name!r} is not in {inventory}", key="--host",
                              hint=f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(inv.names())}")
        if host not in hosts:
            hosts.append(host)
    return hosts


def age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def owners_table(reports: list[PortReport], port: int) -> Table:
    table = Table("host", "pid", "user", "command", "age", "state", "ddpctl job", "action",
                  title=f"holders of port {port}")
    for r in reports:
        for o in r.owners:
            action = f"refuse: {o.refusal}" if o.refusal else kill_action(o)
            table.add_row(r.host, str(o.pid), o.user, o.command[:60], age(o.age_s), o.status,
                          o.ddpctl_job_id or "-", action)
    return table


def kill_action(o: PortOwner) -> str:
    """What confirming this row kills: the owner's tree, or for a torchrun worker its agent's."""
    if o.torchrun_agent:
        return f"kill torchrun agent {o.torchrun_agent} + all its workers"
    return "kill torchrun agent + all its workers" if o.is_torchrun else "kill (+ children)"


def describe_free(r: PortReport) -> str:
    if r.owners:
        return f"{r.host}: port {r.port} is held by {len(r.owners)} process(es)"
    if r.time_wait:
        return (f"{r.host}: port {r.port} has no process; only {r.time_wait} TIME_WAIT socket(s), gone in "
                f"≤ {max(1, round(r.time_wait_max_s))} s (torchrun's store binds with SO_REUSEADDR, so it can "
                "use the port now): nothing to kill")
    return f"{r.host}: port {r.port} is free"


def describe_unbound(r: PortReport) -> str:
    """No process holds the port, yet a bind fails: say what still sits on it and what to do."""
    if r.time_wait:
        return (f"{r.host}: port {r.port} has no process, yet it does not bind ({r.bind_error}): its "
                f"{r.time_wait} TIME_WAIT socket(s) did not set SO_REUSEADDR and refuse torchrun's store "
                f"for ≤ {max(1, round(r.time_wait_max_s))} s; wait, or use another port")
    return (f"{r.host}: port {r.port} has no process, yet it does not bind ({r.bind_error}); "
            "look again in a moment, or use another port")


def stdin_is_terminal() -> bool:
    return sys.stdin.isatty()


def confirm(yes: bool, count: int) -> bool:
    """--yes, or a "y" typed on a terminal; without a terminal nothing is killed unasked."""
    if yes:
        return True
    if not stdin_is_terminal():
        err_console.print("not a terminal: pass --yes to kill without asking (or --dry-run to only look)")
        return False
    return typer.confirm(f"kill {count} process(es) and their trees?", default=False, err=True)


def report_json(port: int, reports: dict[str, PortReport], failed: dict[str, Any], code: int) -> str:
    return json.dumps({"port": port, "exit_code": code, "hosts": {h: r.to_json() for h, r in reports.items()},
                       "failed": {h: e.to_json() for h, e in failed.items()}}, default=str)


@handle_errors
@ssh_flags()
def kill_port_command(
    port: PortArg,
    host: Annotated[list[str] | None, typer.Option(
        "--host", help="Host to act on (repeatable): an inventory host with -i, else as `ssh HOST`.")] = None,
    inventory: InventoryOpt = None,
    all_hosts: Annotated[bool, typer.Option("--all", help="Act on every inventory host.")] = False,
    udp: Annotated[bool, typer.Option("--udp", help="A UDP port instead of TCP.")] = False,
    grace: GraceOpt = 5.0,
    force: Annotated[bool, typer.Option("--force", help="Also kill other users' processes and system services.")]
    = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show who holds the port.")] = False,
    as_json: JsonOpt = False,
    *,
    connection: Connection,
) -> None:
    """Free a port: show its holders, confirm, kill, verify.

    It shows the port's holders (pid, user, command, age, ddpctl job), confirms, kills each
    holder's process tree (a torchrun worker: its agent and all workers; SIGTERM, then SIGKILL
    after --grace), then verifies the port is free on each host.

    Without --host/--all it acts on this machine (no SSH); --host without -i is reached as `ssh
    HOST` would. Without --force, other users' processes and system services (sshd, systemd) are
    refused, saying why; pid 1 and ddpctl's own session never are. On a terminal it asks first;
    when stdin is not a terminal it refuses to kill unless --yes is given (exit 1).
    A port held only by TIME_WAIT sockets is reported, not killed. Free means no process holds
    it and it binds as torchrun's store binds. Exit 0 when the port is free on every host asked
    (--dry-run included), 1 otherwise, 2 on bad input.

    \b
    Examples:
      ddpctl kill-port 29500 --dry-run            # only show who holds it
      ddpctl kill-port 29500 -i hosts.toml --all  # free it on every host
    """
    hosts = select_hosts(inventory, host, all_hosts)
    proto = "udp" if udp else "tcp"
    with make_pool(connection) as pool:
        found = find_port_owners(pool, hosts, port, proto, force)
        reports = [found.succeeded[h.name] for h in hosts if h.name in found.succeeded]
        killable = {r.host: [o.pid for o in r.killable] for r in reports if r.killable}
        if not as_json:
            show_owners(reports, port, found.failed)
        count = sum(len(p) for p in killable.values())
        done = None
        if count and not dry_run and confirm(yes, count):
            done = free_port(pool, [h for h in hosts if h.name in killable], port, proto, grace=grace, force=force,
                             expect=killable)
    results = {**found.succeeded, **(done.succeeded if done else {})}
    failed = {**found.failed, **(done.failed if done else {})}
    code = 0 if all(r.free for r in results.values()) and not failed else 1
    if as_json:
        typer.echo(report_json(port, results, failed, code))
    else:
        show_results([results[h.name] for h in hosts if h.name in results])
        for name, err in (done.failed if done else {}).items():
            if name not in found.failed:
                print_host_error(err)
    raise typer.Exit(code)


def show_owners(reports: list[PortReport], port: int, failed: dict[str, HostError]) -> None:
    if any(r.owners for r in reports):
        console.print(owners_table(reports, port))
    for r in reports:
        for o in r.owners:
            if o.refusal:
                console.print(f"{r.host}: refusing pid {o.pid} ({o.user}): {o.refusal}", markup=False)
        for u in r.unseen:
            fix = "run as root" + ("" if u.user == "root" else f" or as {u.user}")
            console.print(f"{r.host}: a {u.status} socket {u.laddr} belongs to a process of user {u.user} that "
                          f"this user cannot see (or kill): {fix}", markup=False)
    for err in failed.values():
        print_host_error(err)


def show_results(reports: list[PortReport]) -> None:
    """One result line per host (after the killed/left lines of the hosts acted on)."""
    for r in reports:
        for k in r.killed:
            console.print(f"{r.host}: killed pid {k.pid} ({k.signal}){'' if k.owner else ' [tree]'}: {k.command[:80]}",
                          markup=False)
        for e in r.errors:
            console.print(f"{r.host}: error: {e}", markup=False)
        if r.free and r.free_after is None:
            console.print(describe_free(r), markup=False)
        elif r.free:
            tw = f" ({r.time_wait} TIME_WAIT socket(s) left, no process)" if r.time_wait else ""
            console.print(f"{r.host}: port {r.port} is now free{tw}", markup=False)
        elif r.bind_error:  # set only where no process holds the port
            console.print(describe_unbound(r), markup=False)
        else:
            after = r.after if r.free_after is not None else None
            pids = [o.pid for o in (after if after is not None else r.owners)]
            state = "STILL HELD" if r.free_after is not None else "held, nothing killed"
            console.print(f"{r.host}: port {r.port} is {state} (pid {', '.join(map(str, pids)) or '?'})",
                          markup=False)
