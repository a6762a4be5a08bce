"""The `ddpctl` command: a typer app whose commands live in orchestrator/commands/.

A command line that names its command imports that command's module only (`ddpctl doctor` loads
no launch, sync or ssh-setup code): the start-up is part of every command's wall time. `--help`,
shell completion and `app` (the tests' CliRunner) get the whole app."""

from __future__ import annotations

import atexit
import gc
import importlib
import inspect
import sys
from collections.abc import Sequence
from typing import Annotated

import typer

from orchestrator import __version__

# command name -> (module in orchestrator/commands/, its typer function)
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("up", "up_command"),
    "doctor": ("doctor", "doctor_command"),
    "kill-port": ("kill_port", "kill_port_command"),
    "ps": ("lifecycle", "ps_command"),
    "down": ("lifecycle", "down_command"),
    "logs": ("lifecycle", "logs_command"),
    "stacks": ("stacks", "stacks_command"),
    "top": ("top", "top_command"),
    "ssh-setup": ("ssh_setup", "ssh_setup_command"),
    "sync": ("sync", "sync_command"),
    "prune": ("prune", "prune_command"),
    "hosts": ("hosts", "hosts_command"),
    "runs": ("runs", "runs_command"),
}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ddpctl {__version__}")
        raise typer.Exit()


def root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """ddpctl: doctor, up, kill-port, ps, down, logs."""


def build(only: str | None = None) -> typer.Typer:
    """The app with every command, or with `only` that one."""
    cli = typer.Typer(
        name="ddpctl",
        help="Diagnose, launch and clean up multi-node PyTorch DDP jobs over SSH or Slurm.",
        epilog="Start with `ddpctl doctor job.toml`, then `ddpctl up job.toml`. What a doctor finding means: "
               "`ddpctl doctor --explain CHECK`. Every command's --help ends with examples.",
        no_args_is_help=True,
        add_completion=True,
        pretty_exceptions_enable=False,
    )
    cli.callback()(root)
    for name, (module, function) in COMMANDS.items():
        if only in (None, name):
            command = getattr(importlib.import_module(f"orchestrator.commands.{module}"), function)
            text, examples = help_and_examples(command)
            cli.command(name, help=text, short_help=summary(text), epilog=examples)(command)
    return cli


def help_and_examples(command: object) -> tuple[str, str | None]:
    """A command's docstring as its help, and the examples it ends with (a `\\b` paragraph that
    opens with "Examples:") as the epilog, so that `--help` ends with them, after the options."""
    doc = inspect.getdoc(command) or ""
    text, marked, examples = doc.partition("\b\nExamples:")
    return (text.rstrip(), "Examples:" + examples.rstrip()) if marked else (doc, None)


def summary(text: str) -> str:
    """A command's line in `ddpctl --help`: its help's first sentence, unwrapped (the
    docstring's own line breaks would cut it mid-sentence)."""
    paragraph = " ".join(text.split("\n\n")[0].split())
    sentence, dot, _ = paragraph.partition(". ")
    return sentence + "." if dot else paragraph


def command_named(args: Sequence[str]) -> str | None:
    """The command this command line runs, where its first word names one; else None."""
    for arg in args:
        if not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


def __getattr__(name: str) -> typer.Typer:
    if name == "app":
        return build()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    # The process ends right after its command: no last garbage collection over every module it
    # imported (~45 ms of each command's wall time; atexit runs the first-registered handler last).
    atexit.register(gc.freeze)
    build(command_named(sys.argv[1:]))()
