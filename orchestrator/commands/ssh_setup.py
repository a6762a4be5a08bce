"""`ddpctl ssh-setup`: install this machine's key on every host with one password login each, then
verify key-only login and print a per-host table."""

from __future__ import annotations

import getpass
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer
from rich.markup import escape
from rich.table import Table

from inventory import ConfigError, Host, load_job
from orchestrator.commands.common import (
    InventoryOpt,
    JsonOpt,
    console,
    err_console,
    handle_errors,
    ssh_flags,
)
from orchestrator.hostops.ssh_setup import Outcome, SetupOptions, SetupReport, setup_hosts, ssh_setup
from orchestrator.hostops.targets import inventory_at
from orchestrator.remote.keys import DEFAULT_KEY
from orchestrator.remote.ssh_options import Connection

JobArg = Annotated[Path | None, typer.Argument(help="Job file (job.toml): set up the hosts it runs on.",
                                               show_default=False)]
STYLE = {Outcome.INSTALLED: "green", Outcome.PRESENT: "green", Outcome.LOCAL: "dim", Outcome.FAILED: "bold red"}


def select_hosts(job_file: Path | None, inventory: Path | None) -> list[Host]:
    if job_file is not None and inventory is not None:
        raise ConfigError("give a job file or --inventory, not both", key="--inventory",
                          hint="the job file names its inventory; drop -i")
    if job_file is not None:
        return setup_hosts(load_job(job_file))
    return list(inventory_at(inventory).hosts)


def login_name(host: Host) -> str:
    return f"{host.user}@{host.name}" if host.user else host.name


def read_passwords(hosts: Sequence[Host], ask_each: bool, from_stdin: bool, stdin: TextIO,
                   prompt: Callable[[str], str], is_terminal: bool) -> dict[str, str]:
    """One password for every host, or one per host (--ask-each, in inventory order): lines of
    standard input with --password-stdin, else (or when standard input is a terminal, which would
    echo it) asked on the terminal without echo."""
    if from_stdin and not is_terminal:
        wanted = len(hosts) if ask_each else 1
        lines = [stdin.readline() for _ in range(wanted)]
        got = sum(1 for line in lines if line)
        if got < wanted:
            order = f" (one per host, in this order: {', '.join(h.name for h in hosts)})" if ask_each else ""
            raise ConfigError(f"--password-stdin: expected {wanted} line(s) on standard input{order}, got {got}",
                              key="--password-stdin", hint="end each password with a newline")
        secrets = [line.removesuffix("\n").removesuffix("\r") for line in lines]
    elif not is_terminal:
        raise ConfigError("standard input is not a terminal, so ddpctl cannot ask for the password",
                          key="--password-stdin",
                          hint="pipe it in: ddpctl ssh-setup ... --password-stdin < file-with-the-password "
                               "(with --ask-each: one line per host, in inventory order)")
    elif ask_each or len(hosts) == 1:
        secrets = [prompt(f"SSH password for {login_name(h)}: ") for h in hosts]
    else:
        secrets = [prompt(f"SSH password (the same for all {len(hosts)} host(s)): ")]
    return {h.name: secrets[i if len(secrets) > 1 else 0] for i, h in enumerate(hosts)}


def result_table(report: SetupReport) -> Table:
    table = Table("host", "address", "result", "reason", "key login", "details", title="ssh-setup")
    for h in report.hosts:
        login = "✓" if h.verified else ("✗" if h.failed else "-")
        table.add_row(h.host, h.address, f"[{STYLE[h.outcome]}]{h.outcome.value}[/]",
                      h.reason.value if h.reason else "", login, "" if h.failed else escape(h.message))
    return table


def render(report: SetupReport, out: Any) -> None:
    key = report.key
    made = "created" if key.created else "existing"
    out.print(f"key: {escape(str(key.path))} ({made}, {key.algorithm} {key.fingerprint})", highlight=False)
    for rec in report.new_host_keys:
        out.print(f"recorded new host key of {escape(rec.name)} ({escape(rec.known_as)}): {rec.key_type} "
                  f"{rec.fingerprint} in {escape(str(rec.file))}", highlight=False)
    out.print(result_table(report))
    for h in report.hosts:
        if h.failed:
            out.print(f"[bold red]{escape(h.host)}:[/] {escape(h.reason.value if h.reason else '')}: "
                      f"{escape(h.message)}", highlight=False)
            if h.fix:
                out.print(f"  [bold]fix:[/] {escape(h.fix)}", highlight=False)


def to_json(report: SetupReport) -> str:
    key = report.key
    data: Mapping[str, Any] = {
        "exit_code": report.exit_code,
        "key": {"path": str(key.path), "public_key": key.public_line, "algorithm": key.algorithm,
                "fingerprint": key.fingerprint, "created": key.created},
        "new_host_keys": [{"host": r.name, "known_as": r.known_as, "type": r.key_type,
                           "fingerprint": r.fingerprint, "file": str(r.file)} for r in report.new_host_keys],
        "hosts": [{"host": h.host, "address": h.address, "user": h.user, "outcome": h.outcome.value,
                   "reason": h.reason.value if h.reason else None, "message": h.message, "fix": h.fix,
                   "key_login": h.verified} for h in report.hosts],
    }
    return json.dumps(data)


@handle_errors
@ssh_flags()
def ssh_setup_command(
    job_file: JobArg = None,
    inventory: InventoryOpt = None,
    key: Annotated[Path, typer.Option("--key", help="Private key to install; created (Ed25519, 0600, .pub "
                                      "beside it) when missing.")] = DEFAULT_KEY,
    password_stdin: Annotated[bool, typer.Option(
        "--password-stdin", help="Read the password from standard input (one line; with --ask-each one "
                                 "per host, in inventory order) instead of asking on the terminal.")] = False,
    ask_each: Annotated[bool, typer.Option("--ask-each", help="A password per host instead of one for all.")]
    = False,
    as_json: JsonOpt = False,
    *,
    connection: Connection,
) -> None:
    """Set up key login on every host, with a password typed once.

    It creates the key if missing, logs in to every host once with a password, adds the key to
    ~/.ssh/authorized_keys (once), then verifies that the key alone logs in.

    The password is asked once on the terminal (without echo), or read from standard input with
    --password-stdin; it is never printed, logged, written to disk or put on a command line.
    Exit 0 when the key logs in to every host, 1 when any host failed, 2 for bad input.

    \b
    Examples:
      ddpctl ssh-setup job.toml --accept-new-host-keys  # one password for all
      ddpctl ssh-setup -i hosts.toml --ask-each         # a password per host
    """
    hosts = select_hosts(job_file, inventory)
    options = SetupOptions(key=key, connection=connection)

    def passwords(remote: Sequence[Host]) -> Mapping[str, str]:
        return read_passwords(remote, ask_each, password_stdin, sys.stdin, getpass.getpass, sys.stdin.isatty())

    def notice(text: str) -> None:
        if not as_json:
            err_console.print(f"[dim]ssh-setup: {escape(text)}[/]", highlight=False)

    report = ssh_setup(hosts, options, passwords, notice)
    if as_json:
        typer.echo(to_json(report))
    else:
        render(report, console)
    raise typer.Exit(report.exit_code)
