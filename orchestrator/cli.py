"""The `ddpctl` command: a typer app whose commands live in orchestrator/commands/."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator import __version__
from orchestrator.commands import doctor, kill_port, lifecycle, ssh_setup, stacks, sync, up

app = typer.Typer(
    name="ddpctl",
    help="Diagnose, launch and clean up multi-node PyTorch DDP jobs over SSH.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ddpctl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """ddpctl: doctor, up, kill-port, ps, down, logs."""


app.command("up")(up.up_command)
app.command("doctor")(doctor.doctor_command)
app.command("kill-port")(kill_port.kill_port_command)
app.command("ps")(lifecycle.ps_command)
app.command("down")(lifecycle.down_command)
app.command("logs")(lifecycle.logs_command)
app.command("stacks")(stacks.stacks_command)
app.command("ssh-setup")(ssh_setup.ssh_setup_command)
app.command("sync")(sync.sync_command)


def main() -> None:
    app()
