"""Placeholder until this command lands."""

from __future__ import annotations

import typer


def kill_port_command() -> None:
    """Not available yet."""
    typer.echo("ddpctl: this command is not available yet", err=True)
    raise typer.Exit(1)
